"""The vllm-bench-style figures equal hand-computed ones on a fixed set of summary rows, under llmslo's
definitions: TPOT excludes the first token and is none for one-token replies (never 0), ITL is the
token-weighted gaps, latency is over every attempt where it is defined, failed attempts stay in goodput's
denominator; and ``--goodput`` is read as vllm bench writes it."""

from __future__ import annotations

from typing import Any

import pytest

from llmslo.loadgen import Goodput, SpecError, bench_figures, render_table
from llmslo.telemetry import validate_summary


def _row(rid: str, finish: str, *, ttft: float | None = None, last: float | None = None, e2e: float,
         gen: int = 0, itl: list[float] | None = None, reject: str | None = None, error: str | None = None,
         prompt: int = 10) -> dict[str, Any]:
    return {
        "request_id": rid, "model": "m", "version": "client", "tenant_class": "default",
        "arrival_unix_s": 1.8e9, "finish_reason": finish, "reject_reason": reject, "error_type": error,
        "queue_s": None, "ttft_s": ttft, "last_token_s": last, "e2e_s": e2e, "prompt_tokens": prompt,
        "proposed_tokens": 0, "generated_tokens": gen, "sent_tokens": gen, "client_ttft_s": ttft,
        "client_e2e_s": e2e, "stream_paused_s": 0.0, "stream_max_queued": 0, "itl_s": itl,
    }


ROWS = [
    # 5 tokens: TPOT (0.9 - 0.1) / 4 = 0.2; gaps 0.2 each
    _row("a", "length", ttft=0.1, last=0.9, e2e=1.0, gen=5, itl=[0.2, 0.2, 0.2, 0.2]),
    # 3 tokens: TPOT (0.5 - 0.3) / 2 = 0.1
    _row("b", "stop", ttft=0.3, last=0.5, e2e=0.6, gen=3, itl=[0.1, 0.1]),
    # one token: no TPOT (vllm bench would count 0), no gap
    _row("c", "stop", ttft=0.2, last=0.2, e2e=0.25, gen=1),
    # cancelled after 2 tokens: its TTFT, TPOT (0.4) and gap count, it is not successful
    _row("d", "client_cancel", ttft=2.0, last=2.4, e2e=3.0, gen=2, itl=[0.4]),
    _row("e", "rejected", e2e=0.01, reject="queue_full"),
    _row("f", "error", e2e=0.05, error="http_500"),
]


def test_the_fixed_rows_are_valid_summaries() -> None:
    assert all(validate_summary(r) == [] for r in ROWS)


def test_counts_throughputs_and_tokens_match_the_hand_computed_figures() -> None:
    f = bench_figures(ROWS, duration_s=4.0)
    assert (f.attempted, f.completed, f.failed) == (6, 3, 3)
    assert f.finish == {"client_cancel": 1, "error": 1, "length": 1, "rejected": 1, "stop": 2}
    assert f.request_throughput_per_s == pytest.approx(3 / 4.0)
    assert f.generated_tokens == 5 + 3 + 1 and f.output_tokens_per_s == pytest.approx(9 / 4.0)
    assert f.received_tokens == 11 and f.received_tokens_per_s == pytest.approx(11 / 4.0)   # d's 2 tokens too
    assert f.prompt_tokens == 30 and f.one_token_replies == 1


def test_tpot_excludes_the_first_token_and_one_token_replies_have_none() -> None:
    f = bench_figures(ROWS, duration_s=4.0)
    tpots = sorted([0.2, 0.1, 0.4])                          # a, b, d; c has none (never 0)
    assert f.tpot.count == 3
    assert f.tpot.mean_s == pytest.approx(sum(tpots) / 3)
    assert f.tpot.median_s == pytest.approx(0.2)
    assert f.tpot.p99_s == pytest.approx(0.2 + 0.98 * (0.4 - 0.2))   # (n - 1) p = 1.98: between 2nd and 3rd


def test_itl_pools_the_token_weighted_gaps_of_every_attempt() -> None:
    f = bench_figures(ROWS, duration_s=4.0)
    gaps = sorted([0.2] * 4 + [0.1] * 2 + [0.4])
    assert f.itl.count == 7
    assert f.itl.mean_s == pytest.approx(sum(gaps) / 7)
    assert f.itl.median_s == pytest.approx(0.2)
    assert f.itl.p99_s == pytest.approx(0.2 + 0.94 * (0.4 - 0.2))    # (n - 1) p = 5.94


def test_ttft_and_e2e_are_over_every_attempt_where_they_are_defined() -> None:
    f = bench_figures(ROWS, duration_s=4.0)
    assert f.ttft.count == 4 and f.ttft.mean_s == pytest.approx((0.1 + 0.3 + 0.2 + 2.0) / 4)
    assert f.ttft.median_s == pytest.approx((0.2 + 0.3) / 2)
    e2e = sorted([1.0, 0.6, 0.25, 3.0, 0.01, 0.05])
    assert f.e2e.count == 6 and f.e2e.mean_s == pytest.approx(sum(e2e) / 6)
    assert f.e2e.median_s == pytest.approx((0.25 + 0.6) / 2)


def test_goodput_keeps_every_attempt_in_its_denominator() -> None:
    g = Goodput.parse(["ttft:250 tpot:150"])
    assert g == Goodput(ttft_s=0.25, tpot_s=0.15)
    f = bench_figures(ROWS, duration_s=4.0, goodput=g)
    # a: ttft 0.1 ok, tpot 0.2 > 0.15 -> bad; b: ttft 0.3 > 0.25 -> bad; c: one token passes tpot -> good
    assert f.good == 1
    assert f.goodput_fraction == pytest.approx(1 / 6)           # vllm bench would not count d, e, f
    assert f.request_goodput_per_s == pytest.approx(1 / 4.0)
    f = bench_figures(ROWS, duration_s=4.0, goodput=Goodput.parse(["e2el:700"]))
    assert f.good == 2 and f.goodput_fraction == pytest.approx(2 / 6)   # b and c; a ran 1 s


def test_no_rows_no_figures_but_no_crash() -> None:
    f = bench_figures([], duration_s=0.0, goodput=Goodput(ttft_s=1.0))
    assert f.attempted == 0 and f.ttft.mean_s is None and f.request_throughput_per_s is None
    assert f.goodput_fraction is None
    assert "Attempted requests:" in render_table(f)


def test_the_table_shows_the_figures_and_says_where_vllm_bench_differs() -> None:
    text = render_table(bench_figures(ROWS, duration_s=4.0, goodput=Goodput(ttft_s=0.25)))
    lines = text.splitlines()
    assert "Mean TPOT (ms):                              233.33" in lines
    assert "Median ITL (ms):                             200.00" in lines
    assert "Successful requests (stop, length):          3" in lines
    assert "Goodput fraction (good / attempted):         0.3333" in lines
    assert any("stay in the denominator, unlike vllm bench" in line for line in lines)
    assert any(line.startswith("- TPOT:") and "0 for one token" in line for line in lines)


@pytest.mark.parametrize("text", ["ttft", "ttft:", "ttft:abc", "ttft:0", "ttft:-5", "latency:500", "ttft:5 ttft:6"])
def test_a_bad_goodput_names_the_flag_and_the_form(text: str) -> None:
    with pytest.raises(SpecError) as caught:
        Goodput.parse([text])
    assert str(caught.value).startswith("--goodput") and "ttft:500 tpot:50" in str(caught.value)


def test_goodput_takes_repeated_flags_commas_and_vllms_e2el() -> None:
    assert Goodput.parse(["ttft:500", "tpot:50,e2el:3000"]) == Goodput(0.5, 0.05, 3.0)
    assert Goodput.parse(["e2e:1000"]) == Goodput(e2e_s=1.0)
    assert Goodput.parse([]) is None
