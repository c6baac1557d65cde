"""The figures ``vllm bench serve`` prints, computed from a run's summary rows with llmslo's definitions.

Same layout as vLLM's table (counts, throughputs, mean / median / p99 of TTFT, TPOT, ITL and end-to-end
latency, goodput under ``--goodput ttft:MS tpot:MS e2el:MS``), different rules where vLLM's differ from
definitions.md:

======================  =========================================  ===========================================
figure                  llmslo (this table)                        vllm bench serve
======================  =========================================  ===========================================
TPOT                    (last content chunk - first) / (N - 1);    (e2e - TTFT) / (N - 1), 0 for N <= 1
                        none for N <= 1 (never 0)
ITL                     chunk gaps, token-weighted (a chunk of k   one gap per stream chunk
                        tokens gives k gaps of gap / k)
latency population      every attempt for which the interval is    successful requests only
                        defined, whatever its finish reason
goodput                 good / duration, and good / attempted:     good / duration over successful requests;
                        failed, rejected and cancelled attempts    a failed request is not counted anywhere
                        stay in the denominator; a one-token reply
                        passes the TPOT condition
output tokens           generated_tokens of successful attempts    output tokens of successful requests
======================  =========================================  ===========================================

Quantiles interpolate linearly between order statistics (numpy's default, as vLLM and ``llmslo report``).
Standard library only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmslo.loadgen._schedule import SpecError
from llmslo.telemetry import tpot_s

SUCCESS: frozenset[str] = frozenset({"stop", "length"})
"""Finish reasons of a successful attempt."""
GOODPUT_FORM = "KEY:MILLISECONDS pairs, KEY one of ttft, tpot, e2el (or e2e), e.g. 'ttft:500 tpot:50'"
_GOODPUT_KEYS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2e_s", "e2e": "e2e_s"}

Row = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Goodput:
    """SLO thresholds for goodput, seconds (None: not judged). Good = a successful finish and every
    configured threshold met, inclusive; a reply of one token passes the TPOT condition."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    @classmethod
    def parse(cls, items: Sequence[str], flag: str = "--goodput") -> Goodput | None:
        """``vllm bench serve``'s form: ``ttft:500 tpot:50 e2el:3000`` (milliseconds), given as one string or
        several; None when ``items`` is empty. Raises :class:`SpecError` naming ``flag``."""
        pairs = [p for item in items for p in re.split(r"[\s,]+", item.strip()) if p]
        if not pairs:
            return None
        values: dict[str, float] = {}
        for pair in pairs:
            key, sep, number = pair.partition(":")
            name = _GOODPUT_KEYS.get(key.strip().lower())
            if not sep or name is None:
                raise SpecError(flag, pair, GOODPUT_FORM)
            try:
                ms = float(number)
            except ValueError:
                raise SpecError(flag, pair, GOODPUT_FORM, "cannot read the milliseconds in") from None
            if not (math.isfinite(ms) and ms > 0):
                raise SpecError(flag, pair, GOODPUT_FORM, "needs milliseconds > 0, got")
            if name in values:
                raise SpecError(flag, pair, GOODPUT_FORM, "names a key twice:")
            values[name] = ms / 1000.0
        return cls(**values)

    def is_good(self, row: Row) -> bool:
        """Whether ``row`` is good under these thresholds."""
        if row["finish_reason"] not in SUCCESS:
            return False
        if self.ttft_s is not None and not (row["ttft_s"] is not None and row["ttft_s"] <= self.ttft_s):
            return False
        if self.tpot_s is not None:
            tpot = tpot_s(row["ttft_s"], row["last_token_s"], row["generated_tokens"])
            if tpot is not None and tpot > self.tpot_s:
                return False
        return self.e2e_s is None or row["e2e_s"] <= self.e2e_s

    def describe(self) -> str:
        parts = [f"{k} <= {v * 1e3:g} ms" for k, v in (("ttft", self.ttft_s), ("tpot", self.tpot_s),
                                                       ("e2e", self.e2e_s)) if v is not None]
        return " and ".join(parts)

    def to_dict(self) -> dict[str, object]:
        return {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "e2e_s": self.e2e_s,
                "rule": f"finish_reason in {{length, stop}} and {self.describe()} (one-token replies pass tpot); "
                        "every attempt in the denominator"}


def quantile(sorted_values: Sequence[float], p: float) -> float:
    """The ``p`` quantile (0..1) of non-empty sorted values, linear interpolation between order statistics."""
    h = (len(sorted_values) - 1) * p
    lo = math.floor(h)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo])


@dataclass(frozen=True, slots=True)
class Dist:
    """``count`` values (seconds): their mean, median and p99; None when there are none."""

    count: int
    mean_s: float | None
    median_s: float | None
    p99_s: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Dist:
        if not values:
            return cls(0, None, None, None)
        xs = sorted(values)
        return cls(len(xs), math.fsum(xs) / len(xs), quantile(xs, 0.5), quantile(xs, 0.99))

    def to_dict(self) -> dict[str, object]:
        return {"count": self.count, "mean_s": self.mean_s, "median_s": self.median_s, "p99_s": self.p99_s}


@dataclass(frozen=True)
class BenchFigures:
    """The table's figures. Durations in seconds, rates per second; see the module docstring for what
    each one counts."""

    attempted: int
    completed: int
    failed: int
    finish: dict[str, int]
    duration_s: float
    prompt_tokens: int
    generated_tokens: int
    received_tokens: int
    request_throughput_per_s: float | None
    output_tokens_per_s: float | None
    received_tokens_per_s: float | None
    ttft: Dist
    tpot: Dist
    itl: Dist
    e2e: Dist
    one_token_replies: int
    goodput: Goodput | None
    good: int | None
    request_goodput_per_s: float | None
    goodput_fraction: float | None

    def to_dict(self) -> dict[str, object]:
        return {
            "attempted": self.attempted, "completed": self.completed, "failed": self.failed,
            "finish": dict(self.finish), "duration_s": self.duration_s, "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens, "received_tokens": self.received_tokens,
            "request_throughput_per_s": self.request_throughput_per_s,
            "output_generated_tokens_per_s": self.output_tokens_per_s,
            "received_sent_tokens_per_s": self.received_tokens_per_s,
            "ttft_s": self.ttft.to_dict(), "tpot_s": self.tpot.to_dict(), "itl_s": self.itl.to_dict(),
            "e2e_s": self.e2e.to_dict(), "one_token_replies": self.one_token_replies,
            "goodput": None if self.goodput is None else self.goodput.to_dict(), "good": self.good,
            "request_goodput_per_s": self.request_goodput_per_s, "goodput_fraction": self.goodput_fraction,
            "definitions": dict(DEFINITIONS),
        }


DEFINITIONS: dict[str, str] = {
    "ttft": "first content chunk received - request sent (client clock)",
    "tpot": "(last content chunk - first content chunk) / (generated_tokens - 1); undefined for <= 1 token "
            "(vllm bench: (e2e - ttft) / (N - 1), and 0 for one token)",
    "itl": "gaps between content chunks, token-weighted: a chunk of k tokens gives k gaps of gap / k "
           "(vllm bench: one gap per chunk)",
    "e2e": "end of the attempt (last byte, or the client's hang-up) - request sent",
    "latency_population": "every attempt for which the interval is defined, whatever its finish reason "
                          "(vllm bench: successful requests only)",
    "goodput": "good attempts / duration, and good / attempted; failed, rejected and cancelled attempts stay "
               "in the denominator (vllm bench counts successful requests only)",
    "duration": "from the schedule's start to the end of the last attempt (client monotonic clock)",
}


def bench_figures(rows: Sequence[Row], duration_s: float, goodput: Goodput | None = None) -> BenchFigures:
    """The table's figures over ``rows`` (summary rows of one run) and the run's ``duration_s`` (seconds)."""
    finish: dict[str, int] = {}
    for r in rows:
        finish[r["finish_reason"]] = finish.get(r["finish_reason"], 0) + 1
    ok = [r for r in rows if r["finish_reason"] in SUCCESS]
    ttft = [r["ttft_s"] for r in rows if r["ttft_s"] is not None]
    tpot = [t for r in rows if (t := tpot_s(r["ttft_s"], r["last_token_s"], r["generated_tokens"])) is not None]
    itl = [g for r in rows if r.get("itl_s") for g in r["itl_s"]]
    e2e = [r["e2e_s"] for r in rows]
    generated = sum(r["generated_tokens"] for r in ok)
    received = sum(r["sent_tokens"] for r in rows)
    rate = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: None)
    good = sum(1 for r in rows if goodput.is_good(r)) if goodput is not None else None
    return BenchFigures(
        attempted=len(rows), completed=len(ok), failed=len(rows) - len(ok), finish=dict(sorted(finish.items())),
        duration_s=duration_s, prompt_tokens=sum(r["prompt_tokens"] for r in ok), generated_tokens=generated,
        received_tokens=received, request_throughput_per_s=rate(len(ok)), output_tokens_per_s=rate(generated),
        received_tokens_per_s=rate(received), ttft=Dist.of(ttft), tpot=Dist.of(tpot), itl=Dist.of(itl),
        e2e=Dist.of(e2e), one_token_replies=sum(1 for r in ok if r["generated_tokens"] == 1),
        goodput=goodput, good=good, request_goodput_per_s=None if good is None else rate(good),
        goodput_fraction=None if good is None or not rows else good / len(rows))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render_table(f: BenchFigures, *, title: str = " Serving Benchmark Result ",
                 causes: Mapping[str, Sequence[tuple[str, int]]] | None = None) -> str:
    """The figures as ``vllm bench serve`` lays them out (plain text, 50 columns wide), with a footer that
    says where the definitions differ from vLLM's. ``causes`` (per finish reason, ``(cause, count)`` pairs,
    e.g. :meth:`RunResult.top_causes`) are listed under the count of their finish reason, as
    ``10 × HTTP 400 (empty body)``."""
    line = "{:<44} {}".format
    out = [f"{title:=^56}"]
    out.append(line("Attempted requests:", f.attempted))
    out.append(line("Successful requests (stop, length):", f.completed))
    out.append(line("Failed requests (every other finish):", f.failed))
    for reason, n in f.finish.items():
        if reason not in SUCCESS:
            out.append(line(f"  {reason}:", n))
            out.extend(f"    {count:,} × {cause}" for cause, count in (causes or {}).get(reason, ()))
    out.append(line("Benchmark duration (s):", f"{f.duration_s:.2f}"))
    out.append(line("Total input tokens (successful):", f.prompt_tokens))
    out.append(line("Total generated tokens (successful):", f.generated_tokens))
    out.append(line("Request throughput (successful req/s):", _num(f.request_throughput_per_s)))
    if f.goodput is not None:
        out.append(line("Request goodput (good req/s):", _num(f.request_goodput_per_s)))
        out.append(line("Goodput fraction (good / attempted):",
                        "-" if f.goodput_fraction is None else f"{f.goodput_fraction:.4f}"))
    out.append(line("Output token throughput (generated tok/s):", _num(f.output_tokens_per_s)))
    out.append(line("Received token throughput (sent tok/s):", _num(f.received_tokens_per_s)))
    for name, head, dist in (("TTFT", "Time to First Token", f.ttft),
                             ("TPOT", "Time per Output Token (excl. 1st token)", f.tpot),
                             ("ITL", "Inter-token Latency (token-weighted)", f.itl),
                             ("E2EL", "End-to-end Latency", f.e2e)):
        out.append(f"{head:-^56}")
        out.append(line(f"Mean {name} (ms):", _ms(dist.mean_s)))
        out.append(line(f"Median {name} (ms):", _ms(dist.median_s)))
        out.append(line(f"P99 {name} (ms):", _ms(dist.p99_s)))
        out.append(line("  over (values):", dist.count))
    out.append("=" * 56)
    out.extend(footer(f))
    return "\n".join(out)


def footer(f: BenchFigures) -> list[str]:
    """The footer lines: llmslo's definitions where vllm bench's differ."""
    lines = [
        "Definitions (llmslo; vllm bench serve differs where noted):",
        f"- TPOT: {DEFINITIONS['tpot']}; {f.one_token_replies} one-token repl(ies) have none.",
        f"- ITL: {DEFINITIONS['itl']}.",
        f"- Latency over {DEFINITIONS['latency_population']}.",
    ]
    if f.goodput is not None:
        lines.append(f"- Goodput: good = stop/length and {f.goodput.describe()} (one-token replies pass TPOT); "
                     "failed, rejected and cancelled attempts stay in the denominator, unlike vllm bench.")
    lines.append(f"- Duration: {DEFINITIONS['duration']}.")
    return lines
