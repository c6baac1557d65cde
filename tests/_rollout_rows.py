"""Synthetic request summaries around a rolling update, for the version comparison's tests and benchmark.

:func:`rollout_frame` draws one population of requests (Poisson-like arrivals, lognormal TTFT with a median of
0.4 s and σ = 0.5, 20 to 200 output tokens at 20 to 40 ms each, a fixed mix of errors, timeouts, rejections and
client cancels) over a baseline period and an update window, and splits it between versions at random: with
no ``ttft_factor`` the versions are identical. Rows obey every rule of the request-summary contract.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

T0 = 1_700_000_000.0
"""Start of the synthetic data, Unix seconds."""


@dataclass(frozen=True)
class RolloutScenario:
    """What to draw. ``start_unix_s`` is where the data begins (Unix seconds); the baseline period
    (``baseline_s`` seconds, ``n_baseline`` requests) comes first, then the window (``window_s``,
    ``n_window``). ``ttft_factor`` multiplies the TTFT of a version's requests (per tenant class with
    ``"version:class"`` keys), in the window only when ``window_only``."""

    n_baseline: int = 600
    n_window: int = 1200
    baseline_s: float = 3600.0
    window_s: float = 600.0
    versions: Sequence[str] = ("v1", "v2")
    tenant_classes: Sequence[str] = ("interactive", "batch")
    tenant_shares: Sequence[float] = (0.7, 0.3)
    error_rate: float = 0.01
    timeout_rate: float = 0.005
    reject_rate: float = 0.01
    cancel_rate: float = 0.01
    drained_share: float = 0.0
    """Share of the first version's window requests the drain ended (``server_draining``)."""
    ttft_factor: Mapping[str, float] = field(default_factory=dict)
    window_only: bool = False
    start_unix_s: float = T0

    @property
    def window(self) -> tuple[float, float]:
        """The update window, Unix seconds (after the baseline period)."""
        start = self.start_unix_s + self.baseline_s
        return start, start + self.window_s


def _factor(s: RolloutScenario, version: np.ndarray, tenant: np.ndarray, in_window: np.ndarray) -> np.ndarray:
    factor = np.ones(version.size)
    for key, value in s.ttft_factor.items():
        v, _, cls = key.partition(":")
        hit = (version == v) & ((tenant == cls) if cls else True)
        if s.window_only:
            hit &= in_window
        factor[hit] = value
    return factor


def rollout_frame(seed: int, scenario: RolloutScenario | None = None) -> pl.DataFrame:
    """The requests of one synthetic rollout (see the module docstring), as a frame for ``ingest_frame``."""
    s = scenario or RolloutScenario()
    rng = np.random.default_rng(seed)
    n = s.n_baseline + s.n_window
    lo, hi = s.window
    arrival = np.concatenate([np.sort(rng.uniform(s.start_unix_s, lo - 1.0, s.n_baseline)),
                              np.sort(rng.uniform(lo, hi, s.n_window))])
    in_window = arrival >= lo
    version = rng.choice(np.asarray(s.versions, dtype=object), n)
    tenant = rng.choice(np.asarray(s.tenant_classes, dtype=object), n, p=np.asarray(s.tenant_shares))
    ttft = 0.4 * np.exp(0.5 * rng.standard_normal(n)) * _factor(s, version, tenant, in_window)
    tokens = rng.integers(20, 201, n)
    tpot = rng.uniform(0.02, 0.04, n)
    last = ttft + tpot * (tokens - 1)
    u = rng.uniform(size=n)
    cuts = np.cumsum([s.error_rate, s.timeout_rate, s.reject_rate, s.cancel_rate])
    finish = np.select([u < cuts[0], u < cuts[1], u < cuts[2], u < cuts[3]],
                       ["error", "deadline", "rejected", "client_cancel"], "stop").astype(object)
    drained = in_window & (version == s.versions[0]) & (rng.uniform(size=n) < s.drained_share)
    finish[drained] = "server_draining"
    tokenless = np.isin(finish, ["error", "deadline", "rejected", "client_cancel"])
    e2e = np.where(tokenless, np.where(finish == "rejected", 0.002, ttft * 1.5), last + 0.01)
    e2e = np.where(finish == "deadline", 30.0, e2e)
    queue = np.where(finish == "rejected", np.nan, ttft * 0.2)
    gen = np.where(tokenless, 0, tokens)
    return pl.DataFrame({
        "request_id": [f"r{seed}-{i}" for i in range(n)],
        "model": ["m1"] * n,
        "version": version.tolist(),
        "tenant_class": tenant.tolist(),
        "arrival_unix_s": arrival,
        "finish_reason": finish.tolist(),
        "reject_reason": ["queue_full" if f == "rejected" else None for f in finish],
        "queue_s": [None if np.isnan(q) else float(q) for q in queue],
        "ttft_s": [None if t else float(x) for t, x in zip(tokenless, ttft, strict=True)],
        "last_token_s": [None if t else float(x) for t, x in zip(tokenless, last, strict=True)],
        "e2e_s": e2e,
        "prompt_tokens": rng.integers(50, 500, n),
        "generated_tokens": gen,
        "sent_tokens": gen,
    })
