"""Engine timing profiles: linear prefill and decode times fitted to measured A100/H100 runs.

The source is Splitwise's performance model (``splitwise_sim/perf_model.csv`` in the project's real data:
Mutinifni/splitwise-sim, measured on 8-GPU A100-80GB and H100-80GB nodes). For each (model, hardware)
pair, on the rows with ``tensor_parallel`` 8 (the one setting every pair was measured with), after dropping
exact duplicate rows (the sweeps share their 512-token, batch-1 point, listed three times):

- **prefill**: ``prompt_time`` (ms) against ``prompt_size`` (tokens) on the rows with ``batch_size`` 1,
  ``token_size`` 128 and ``prompt_size`` <= 2048, least squares. Above 2048 tokens the measured prefill
  grows faster than linearly (attention is quadratic): the linear model underestimates it there (at 8192
  tokens on H100, 405 ms against 845 ms measured), which ``docs/server.md`` states.
- **decode**: ``token_time`` (ms per decode step) against ``batch_size`` (1 to 64) on the rows with
  ``prompt_size`` 512 and ``token_size`` 128, least squares.

:func:`fit_profiles` refits them from the CSV (the test checks the constants below against it).
Standard library only.
"""

from __future__ import annotations

import csv
import math
import os
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from llmslo.telemetry import ConfigurationError

FIT_TENSOR_PARALLEL = 8
"""The tensor-parallel degree of the rows the profiles are fitted on."""
PREFILL_MAX_PROMPT = 2048
"""The largest ``prompt_size`` (tokens) of the rows the prefill line is fitted on."""
DECODE_PROMPT = 512
"""The ``prompt_size`` (tokens) of the batch-size sweep the decode line is fitted on."""
FIT_TOKEN_SIZE = 128
"""The ``token_size`` (output tokens) of the rows both lines are fitted on."""


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """How long one engine step takes, from two lines (every time in seconds).

    - prefill of ``n`` prompt tokens joining in one step: ``prefill_base_s + prefill_per_token_s * n``
      (0 when no request joins);
    - one decode step of a batch of ``b`` sequences: ``decode_base_s + decode_per_seq_s * b`` (0 for an
      empty batch).

    ``name`` is ``model/hardware`` (the ``--profile`` value). Raises :class:`ConfigurationError` naming the
    field for a negative or non-finite constant.
    """

    name: str
    model: str
    hardware: str
    tensor_parallel: int
    prefill_base_s: float
    prefill_per_token_s: float
    decode_base_s: float
    decode_per_seq_s: float

    def __post_init__(self) -> None:
        for field in ("prefill_base_s", "prefill_per_token_s", "decode_base_s", "decode_per_seq_s"):
            value = getattr(self, field)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ConfigurationError(f"EngineProfile.{field}: must be a finite number of seconds >= 0, "
                                         f"got {value!r}")

    def prefill_s(self, prompt_tokens: int) -> float:
        """Seconds to prefill ``prompt_tokens`` tokens in one step (0 for none)."""
        return self.prefill_base_s + self.prefill_per_token_s * prompt_tokens if prompt_tokens > 0 else 0.0

    def decode_s(self, batch: int) -> float:
        """Seconds for one decode step of ``batch`` sequences (0 for none)."""
        return self.decode_base_s + self.decode_per_seq_s * batch if batch > 0 else 0.0

    def step_s(self, prompt_tokens: int, batch: int) -> float:
        """Seconds of one engine step: the prefill of the joining requests, then one decode of the batch."""
        return self.prefill_s(prompt_tokens) + self.decode_s(batch)


def _profile(model: str, hardware: str, prefill_ms: tuple[float, float],
             decode_ms: tuple[float, float]) -> EngineProfile:
    return EngineProfile(f"{model}/{hardware}", model, hardware, FIT_TENSOR_PARALLEL, prefill_ms[0] / 1e3,
                         prefill_ms[1] / 1e3, decode_ms[0] / 1e3, decode_ms[1] / 1e3)


PROFILES: Mapping[str, EngineProfile] = {p.name: p for p in (
    # (intercept ms, ms per prompt token), (intercept ms, ms per sequence in the batch): see fit_profiles
    _profile("llama2-70b", "a100-80gb", (42.39963, 0.1120610), (43.53527, 0.4081773)),
    _profile("llama2-70b", "h100-80gb", (40.58902, 0.04445393), (29.64253, 0.3115337)),
    _profile("llama2-70b", "h100-80gb-pcap", (52.76573, 0.05779011), (29.64253, 0.3115337)),
    _profile("bloom-176b", "a100-80gb", (43.82356, 0.2422600), (47.04389, 0.7334666)),
    _profile("bloom-176b", "h100-80gb", (24.29122, 0.1121787), (35.11436, 0.4269744)),
    _profile("bloom-176b", "h100-80gb-pcap", (31.57858, 0.1458323), (35.11436, 0.4269744)),
)}
"""The fitted profiles by name (``model/hardware``)."""

DEFAULT_PROFILE = "llama2-70b/h100-80gb"
"""The profile ``llmslo serve`` uses unless ``--profile`` names another."""


def _line(xs: list[float], ys: list[float], what: str) -> tuple[float, float]:
    if len(set(xs)) < 2:
        raise ConfigurationError(f"{what}: needs rows at two or more distinct sizes to fit a line, got {len(xs)} rows")
    fit = statistics.linear_regression(xs, ys)
    return fit.intercept, fit.slope


def fit_profiles(path: str | os.PathLike[str]) -> dict[str, EngineProfile]:
    """Fit every (model, hardware) pair of a Splitwise ``perf_model.csv`` as the module docstring says.

    Returns the profiles by name, constants in seconds. Raises :class:`ConfigurationError` naming the file,
    the row and the column when a needed column is missing or a value is not a number, and when a pair lacks
    the rows for a fit (then it says which sweep).
    """
    needed = ("model", "hardware", "prompt_size", "batch_size", "token_size", "prompt_time", "token_time",
              "tensor_parallel")
    seen: set[tuple[str, ...]] = set()
    prefill: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    decode: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in needed if c not in (reader.fieldnames or ())]
        if missing:
            raise ConfigurationError(f"{os.fspath(path)}: missing column(s) {', '.join(missing)}")
        for line, row in enumerate(reader, start=2):
            key = tuple(row.get(c) or "" for c in (reader.fieldnames or ()))
            if key in seen:
                continue
            seen.add(key)
            try:
                nums = {c: float(row[c]) for c in needed[2:]}
            except (TypeError, ValueError):
                bad = next(c for c in needed[2:] if not _is_number(row.get(c)))
                raise ConfigurationError(f"{os.fspath(path)}: row {line}, column {bad}: not a number: "
                                         f"{row.get(bad)!r}") from None
            if nums["tensor_parallel"] != FIT_TENSOR_PARALLEL or nums["token_size"] != FIT_TOKEN_SIZE:
                continue
            pair = (row["model"], row["hardware"])
            if nums["batch_size"] == 1 and nums["prompt_size"] <= PREFILL_MAX_PROMPT:
                xs, ys = prefill.setdefault(pair, ([], []))
                xs.append(nums["prompt_size"])
                ys.append(nums["prompt_time"])
            if nums["prompt_size"] == DECODE_PROMPT:
                xs, ys = decode.setdefault(pair, ([], []))
                xs.append(nums["batch_size"])
                ys.append(nums["token_time"])
    out: dict[str, EngineProfile] = {}
    for pair in sorted(set(prefill) | set(decode)):
        name = "/".join(pair)
        p = _line(*prefill.get(pair, ([], [])), f"{os.fspath(path)}: {name} prefill sweep")
        d = _line(*decode.get(pair, ([], [])), f"{os.fspath(path)}: {name} decode sweep")
        out[name] = _profile(pair[0], pair[1], p, d)
    return out


def _is_number(text: object) -> bool:
    try:
        float(str(text))
    except ValueError:
        return False
    return True
