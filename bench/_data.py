"""Synthetic request summaries for the benchmarks: valid rows of the contract, fully vectorised.

:func:`synthetic_summaries` returns an Arrow table with :func:`llmslo.analysis.arrow_schema` whose rows
obey every rule of ``llmslo.telemetry.validate_summary``. The mix is loosely realistic:

* 3 models (60/30/10 %, with different prefill and decode speeds), 2 versions (v1 85 %, v2 15 %),
  2 tenant classes (interactive 80 %, batch 20 %, batch queues longer and is more patient);
* finish reasons stop 80 %, length 8 %, client_cancel 4 %, deadline 2 %, rejected 4 %, error 2 %;
* rejected: ``reject_reason = 'queue_full'``, no queue/TTFT/last token, 0 tokens, e2e of ~2 ms;
* error: ``error_type`` cuda_oom or engine_error, 60 % after some tokens;
* client_cancel and deadline: half end before any token (censored TTFT; queue set only if scheduled);
* a row without a first token has ``ttft_s``/``last_token_s``/``client_ttft_s`` null and 0 tokens
  generated and sent; otherwise ``queue_s <= ttft_s <= last_token_s <= e2e_s``, ``1 <= generated``,
  ``sent <= generated`` (1 % slow readers send fewer, with ``stream_paused_s > 0``);
* ``itl_s`` is null everywhere; ``request_id`` is ``req-<seed>-<10-digit index>``, unique per seed.

Self-check: ``.venv/bin/python bench/_data.py`` validates a 10,000-row sample row by row with
``validate_summary`` and ingests it into a temporary store (the store re-validates it in SQL).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from llmslo.analysis import arrow_schema
from llmslo.telemetry import COLUMN_NAMES

MODELS: tuple[str, ...] = ("llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b")
MODEL_SHARES: tuple[float, ...] = (0.6, 0.3, 0.1)
MODEL_SLOWNESS: tuple[float, ...] = (1.0, 3.0, 1.8)
"""Multiplier on prefill and decode time per model."""
VERSIONS: tuple[str, ...] = ("v1", "v2")
TENANTS: tuple[str, ...] = ("interactive", "batch")
REASONS: tuple[str, ...] = ("stop", "length", "client_cancel", "deadline", "rejected", "error")
REASON_SHARES: tuple[float, ...] = (0.80, 0.08, 0.04, 0.02, 0.04, 0.02)
STOP, LENGTH, CANCEL, DEADLINE, REJECTED, ERROR = range(6)
ERROR_TYPES: tuple[str, ...] = ("cuda_oom", "engine_error")
ARRIVALS_PER_S = 200.0
"""Mean arrival rate; 1,000,000 rows span about 83 minutes."""
START_UNIX_S = 1_735_689_600.0
DEADLINE_S = 30.0

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def _pick(values: tuple[str, ...], idx: IntArray, valid: BoolArray | None = None) -> pa.Array:
    """String column from category indices (null where ``valid`` is False), without Python objects."""
    indices = pa.array(idx.astype(np.int32), mask=None if valid is None else ~valid)
    return pc.take(pa.array(values, type=pa.string()), indices)


def _lognormal(rng: np.random.Generator, median: float, sigma: float, n: int) -> FloatArray:
    return rng.lognormal(np.log(median), sigma, n)


def _floats(values: FloatArray, valid: BoolArray | None = None) -> pa.Array:
    return pa.array(values, type=pa.float64(), mask=None if valid is None else ~valid)


def synthetic_summaries(n: int, seed: int = 0) -> pa.Table:
    """``n`` valid request summaries (schema :func:`llmslo.analysis.arrow_schema`), reproducible by ``seed``.

    Request ids embed the seed, so tables generated with different seeds can share a store.
    """
    rng = np.random.default_rng(seed)
    model = rng.choice(len(MODELS), size=n, p=MODEL_SHARES)
    slowness = np.asarray(MODEL_SLOWNESS)[model]
    version = (rng.random(n) < 0.15).astype(np.int64)
    batch = rng.random(n) < 0.2
    reason = rng.choice(len(REASONS), size=n, p=REASON_SHARES)
    arrival = START_UNIX_S + seed * 86_400.0 + np.cumsum(rng.exponential(1.0 / ARRIVALS_PER_S, n))

    prompt = np.clip(np.rint(_lognormal(rng, 800.0, 0.9, n)), 1, 32_000).astype(np.int64)
    max_tokens = np.where(rng.random(n) < 0.1, 256, 1024).astype(np.int64)
    wanted = np.clip(np.rint(_lognormal(rng, 200.0, 0.8, n)), 1, 4096).astype(np.int64)
    partial = 1 + np.floor(rng.random(n) * wanted).astype(np.int64)  # 1..wanted tokens before stopping
    u = rng.random(n)
    generated = np.select(
        [reason == STOP, reason == LENGTH, reason == CANCEL, reason == DEADLINE, reason == ERROR],
        [np.minimum(wanted, max_tokens - 1), max_tokens,
         np.where(u < 0.5, partial, 0), np.where(u < 0.5, partial, 0), np.where(u < 0.6, partial, 0)],
        default=0,
    ).astype(np.int64)
    has_token = generated > 0

    # Scheduling: every request with a token was scheduled; of the others, rejected ones never were,
    # and about half of the cancelled/timed-out ones were still queued when they ended.
    scheduled = has_token | ((reason != REJECTED) & ((reason == ERROR) | (rng.random(n) < 0.5)))
    queue = _lognormal(rng, 0.05, 1.0, n) * np.where(batch, 3.0, 1.0)
    prefill = (0.02 + prompt * 2e-5) * slowness * _lognormal(rng, 1.0, 0.3, n)
    ttft = queue + prefill
    gap = 0.02 * slowness * _lognormal(rng, 1.0, 0.35, n)
    last = ttft + (generated - 1).clip(0) * gap
    finish = 0.001 + np.where(reason == STOP, 0.0, rng.exponential(0.05, n))

    patience = _lognormal(rng, 9.0, 0.3, n) * np.where(batch, 4.0, 1.0)
    e2e_no_token = np.select(
        [reason == CANCEL, reason == DEADLINE, reason == REJECTED],
        [patience, np.full(n, DEADLINE_S), 0.002 * _lognormal(rng, 1.0, 0.2, n)],
        default=queue + prefill * rng.random(n),  # error before the first token
    )
    e2e = np.where(has_token, last + finish, e2e_no_token)
    e2e = np.where(has_token & (reason == DEADLINE), np.maximum(e2e, DEADLINE_S), e2e)
    # A request without a token that was scheduled left the queue before it ended.
    queue = np.where(has_token | (reason == ERROR), queue, e2e * rng.random(n))

    slow_reader = has_token & (rng.random(n) < 0.01)
    sent = np.where(slow_reader, np.floor(generated * rng.random(n)), generated)
    sent = np.where(reason == CANCEL, np.floor(generated * (0.5 + 0.5 * rng.random(n))), sent)
    sent = sent.astype(np.int64)
    proposed = np.where((model == 0) & has_token, np.rint(generated * 1.6), 0).astype(np.int64)
    rtt = _lognormal(rng, 0.02, 0.5, n)
    paused = np.where(slow_reader, rng.exponential(2.0, n), 0.0)
    max_queued = np.where(slow_reader, rng.integers(2, 17, n), 1).astype(np.int64)

    ids = pc.cast(pa.array(np.arange(n, dtype=np.int64)), pa.string())
    request_id = pc.binary_join_element_wise(f"req-{seed}-", pc.utf8_lpad(ids, 10, "0"), "")
    columns: dict[str, pa.Array] = {
        "request_id": request_id,
        "model": _pick(MODELS, model),
        "version": _pick(VERSIONS, version),
        "tenant_class": _pick(TENANTS, batch.astype(np.int64)),
        "arrival_unix_s": _floats(arrival),
        "finish_reason": _pick(REASONS, reason),
        "reject_reason": _pick(("queue_full",), np.zeros(n, dtype=np.int64), reason == REJECTED),
        "error_type": _pick(ERROR_TYPES, (rng.random(n) < 0.5).astype(np.int64), reason == ERROR),
        "queue_s": _floats(queue, scheduled),
        "ttft_s": _floats(ttft, has_token),
        "last_token_s": _floats(last, has_token),
        "e2e_s": _floats(e2e),
        "prompt_tokens": pa.array(prompt),
        "proposed_tokens": pa.array(proposed),
        "generated_tokens": pa.array(generated),
        "sent_tokens": pa.array(sent),
        "client_ttft_s": _floats(ttft + rtt, has_token),
        "client_e2e_s": _floats(e2e + rtt),
        "stream_paused_s": _floats(paused),
        "stream_max_queued": pa.array(max_queued),
        "itl_s": pa.nulls(n, type=pa.list_(pa.float64())),
    }
    assert tuple(columns) == COLUMN_NAMES
    return pa.Table.from_arrays(list(columns.values()), schema=arrow_schema())


def synthetic_batches(total: int, batch_rows: int = 1_000_000, seed: int = 0) -> list[tuple[int, int]]:
    """``(rows, seed)`` of the batches that make up ``total`` rows (distinct seeds: distinct ids)."""
    out: list[tuple[int, int]] = []
    k = 0
    while total > 0:
        rows = min(batch_rows, total)
        out.append((rows, seed + k))
        total -= rows
        k += 1
    return out


def self_check(n: int = 10_000, seed: int = 0) -> dict[str, object]:
    """Validate ``n`` generated rows with ``validate_summary`` and by ingesting them; return the mix."""
    from llmslo.analysis import Store
    from llmslo.telemetry import validate_summary

    table = synthetic_summaries(n, seed)
    assert table.schema.equals(arrow_schema(), check_metadata=True)
    bad = [(i, v) for i, row in enumerate(table.to_pylist()) for v in validate_summary(row)]
    assert not bad, f"{len(bad)} violations, first: {bad[:3]}"
    assert pc.count_distinct(table["request_id"]).as_py() == n
    tmp = tempfile.mkdtemp(prefix="llmslo-bench-")
    try:
        with Store.open(Path(tmp) / "check.duckdb") as store:
            report = store.ingest_frame(table)
            assert report.rows_inserted == n and report.rows_rejected == 0, report
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    counts = pc.value_counts(table["finish_reason"]).to_pylist()
    return {"rows": n, "finish_reason": {c["values"]: c["counts"] / n for c in counts}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=10_000, help="rows to validate (default 10,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-rows", type=int, default=1_000_000,
                        help="also time generating this many rows (0: skip)")
    args = parser.parse_args()
    print(self_check(args.rows, args.seed))
    if args.time_rows:
        t0 = time.perf_counter()
        synthetic_summaries(args.time_rows, args.seed)
        print(f"generated {args.time_rows:,} rows in {time.perf_counter() - t0:.2f} s")
    print("self-check OK: every row valid (validate_summary and Store.ingest_frame)")


if __name__ == "__main__":
    main()
