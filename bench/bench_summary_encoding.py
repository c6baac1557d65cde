"""A request summary as a JSONL line: the writer's encoding (``encode_row``) beside json's.

Every server that keeps summaries encodes one per request in its sink's writer thread. A summary's twenty
fields, and its token-weighted gaps where it has them (``itl_s``, one float per token: ``llmslo load``'s client
rows always, a server's with ``Telemetry(record_itl=True)``), which json writes with their shortest repr.
:func:`llmslo.telemetry._sink.encode_row` writes the same JSON in C (``summary_json``), floats of whole
nanoseconds (the token log's times and gaps) from that integer. Both encode the same rows, without gaps (a
server's default) and with 20, 64 and 256 gaps of whole nanoseconds, in the same run, their order rotating from
one repeat to the next; each figure is the median over the repeats of microseconds per row, the ratio within
each repeat. Every row is read back and must equal json's, float for float.

Run: ``.venv/bin/python -m llmslo.bench.bench_summary_encoding --repeats 7 --rows 5000``
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable

from llmslo.bench._util import median, table
from llmslo.telemetry import _sink

GAPS = (0, 20, 64, 256)


def summary_row(rng: random.Random, gaps: int) -> dict[str, object]:
    """A summary as the telemetry writes it, with ``gaps`` gaps of whole nanoseconds (0.05-2 ms; 0: no
    ``itl_s`` field)."""
    tokens = gaps + 1 if gaps else 64
    row: dict[str, object] = {
        "request_id": f"{rng.getrandbits(128):032x}", "model": "llama-3-8b", "version": "v1",
        "tenant_class": "default", "arrival_unix_s": 1_796_000_000 + rng.random() * 1000, "finish_reason": "stop",
        "reject_reason": None, "error_type": None, "queue_s": rng.randint(0, 10**7) / 1e9,
        "ttft_s": rng.randint(10**7, 10**9) / 1e9, "last_token_s": 1.25, "e2e_s": 1.2501, "prompt_tokens": 412,
        "proposed_tokens": 0, "generated_tokens": tokens, "sent_tokens": tokens, "client_ttft_s": None,
        "stream_paused_s": 0.0, "stream_max_queued": 0,
    }
    if gaps:
        row["itl_s"] = [rng.randint(50_000, 2_000_000) / 1e9 for _ in range(gaps)]
    return row


def _time_per_row(encode: Callable[[dict[str, object]], str], rows: list[dict[str, object]]) -> float:
    """Microseconds per row to encode every row of ``rows`` once."""
    start = time.perf_counter_ns()
    for row in rows:
        encode(row)
    return (time.perf_counter_ns() - start) / len(rows) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7, help="repeats of each case (medians are reported)")
    ap.add_argument("--rows", type=int, default=5000, help="rows encoded per case and repeat")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.repeats < 1 or args.rows < 1:
        ap.error("--repeats and --rows must be at least 1")
    if _sink._summary_json is None:
        raise SystemExit("the native token log module is not built (no C compiler at install): encode_row is "
                         "json itself here; nothing to compare")
    rng = random.Random(args.seed)
    json_encode = json.JSONEncoder(separators=(",", ":")).encode
    cases: dict[str, Callable[[dict[str, object]], str]] = {"json": json_encode, "encode_row": _sink.encode_row}
    out = []
    for gaps in GAPS:
        rows = [summary_row(rng, gaps) for _ in range(args.rows)]
        for row in rows:
            if json.loads(_sink.encode_row(row)) != json.loads(json_encode(row)):
                raise SystemExit(f"a row with {gaps} gaps reads back differently: {row['request_id']}")
        times: dict[str, list[float]] = {name: [] for name in cases}
        ratios: list[float] = []
        for r in range(args.repeats):
            names = list(cases)[r % 2:] + list(cases)[:r % 2]
            got = {name: _time_per_row(cases[name], rows) for name in names}
            for name, us in got.items():
                times[name].append(us)
            ratios.append(got["json"] / got["encode_row"])
        out.append([gaps, median(times["encode_row"]), median(times["json"]), f"{median(ratios):.2f}x"])
    print(f"A summary row as a JSONL line, without gaps and with gaps of whole nanoseconds; {args.rows:,} rows per "
          f"case, medians of {args.repeats} repeats; every row reads back as json's")
    print(table(["gaps", "encode_row (us per row)", "json, the baseline (us per row)", "json / encode_row"], out))


if __name__ == "__main__":
    main()
