"""Prometheus scrapes: parsing, bucket-estimated quantiles, SLO attainment, survivor-bias checks, rates.

Fixtures in ``tests/fixtures/scrape`` are hand-written (see its README; names and bucket bounds follow
each server, counts are invented). Real-data tests read ``../shared/real_data`` (the SGLang scrape and the
vLLM start-up scrape) and skip when it is missing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from llmslo.analysis.scrape import (
    KNOWN_METRICS,
    Finding,
    ScrapeFormatError,
    analyze_scrape,
    bucket_quantile,
    compare_scrapes,
    known_metric,
    parse_exposition,
    read_scrape,
)
from llmslo.cli._scrape import scrape_command

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "scrape"
REAL = Path(__file__).resolve().parents[2] / "shared" / "real_data"
SGLANG = "prometheus/sglang_llama3.1-8b_metrics_docs_example.prom.txt"
VLLM_T0 = "vllm_memory_gap_bsc/llama-2-13b_maxseqs128/vllm_metrics_scrape_t0.prom.txt"
INF = math.inf


def _real(relative: str) -> Path:
    path = REAL / relative
    if not path.is_file():
        pytest.skip(f"real data not available: {path} (../shared/real_data is missing)")
    return path


def _finding(findings: Sequence[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


# ---------------------------------------------------------------------------------------------------
# quantile estimates


def test_bucket_quantile_interpolates_linearly_inside_its_bucket_like_promql() -> None:
    buckets = [(0.5, 40.0), (1.0, 70.0), (2.0, 90.0), (5.0, 98.0), (INF, 100.0)]
    p50 = bucket_quantile(0.5, buckets)
    assert p50.value == pytest.approx(0.5 + 0.5 * (50 - 40) / 30) and p50.kind == "interpolated"
    assert (p50.bucket_lower, p50.bucket_upper) == (0.5, 1.0)
    assert bucket_quantile(0.9, buckets).value == pytest.approx(2.0)


def test_the_first_bucket_interpolates_from_zero() -> None:
    assert bucket_quantile(0.25, [(0.05, 100.0), (INF, 100.0)]).value == pytest.approx(0.0125)


def test_a_quantile_in_the_inf_bucket_is_only_at_least_the_highest_bound() -> None:
    est = bucket_quantile(0.99, [(0.5, 40.0), (5.0, 98.0), (INF, 100.0)])
    assert (est.value, est.kind, est.bucket_upper) == (5.0, "at_least", INF)
    assert "≥ 5" in est.label()


def test_no_observations_or_no_inf_bucket_give_no_estimate() -> None:
    assert bucket_quantile(0.5, [(1.0, 0.0), (INF, 0.0)]).value is None
    assert bucket_quantile(0.5, [(1.0, 3.0), (2.0, 5.0)]).kind == "none"
    with pytest.raises(ValueError, match="within"):
        bucket_quantile(1.5, [(1.0, 1.0), (INF, 1.0)])


@given(
    bounds=st.lists(st.floats(0.001, 100.0), min_size=1, max_size=8, unique=True),
    counts=st.lists(st.integers(0, 50), min_size=9, max_size=9),
    q1=st.floats(0.0, 1.0), q2=st.floats(0.0, 1.0),
)
def test_bucket_quantiles_stay_in_their_bucket_and_grow_with_q(bounds: list[float], counts: list[int],
                                                               q1: float, q2: float) -> None:
    les = [*sorted(bounds), INF]
    cumulative = []
    running = 0.0
    for c in counts[: len(les)]:
        running += c
        cumulative.append(running)
    buckets = list(zip(les, cumulative, strict=True))
    lo, hi = sorted((q1, q2))
    a, b = bucket_quantile(lo, buckets), bucket_quantile(hi, buckets)
    if running == 0:
        assert a.value is None and b.value is None
        return
    assert a.value is not None and b.value is not None
    assert a.value <= b.value + 1e-9
    for est in (a, b):
        assert est.value is not None and est.bucket_lower is not None and est.bucket_upper is not None
        assert est.bucket_lower - 1e-9 <= est.value <= est.bucket_upper + 1e-9


# ---------------------------------------------------------------------------------------------------
# parsing


def test_openmetrics_exemplars_created_and_units_are_parsed() -> None:
    scrape = read_scrape(FIXTURES / "llmslo_openmetrics.txt")
    assert scrape.format == "openmetrics"
    fam = scrape.families["llmslo_ttft_seconds"]
    assert (fam.type, fam.unit) == ("histogram", "seconds")
    [series] = [h for h in scrape.histograms() if h.family == "llmslo_ttft_seconds"]
    assert series.created_s == 1699990000.0 and series.count == 100 and series.sum == 120.5
    (le1, e1), (le2, e2), (le3, e3) = series.exemplars
    assert (le1, dict(e1.labels), e1.value, e1.timestamp_s) == (0.5, {"request_id": "r-17"}, 0.31, 1700000000.5)
    assert (le2, e2.value) == (2.0, 1.7)
    assert le3 == INF and dict(e3.labels) == {"request_id": "r-99", "trace_id": "4bf92f3577b34da6"}
    assert e3.timestamp_s is None
    counter = scrape.families["llmslo_requests"]
    assert counter.type == "counter" and {s.name for s in counter.samples} == {"llmslo_requests_total",
                                                                                "llmslo_requests_created"}
    assert analyze_scrape(scrape).exemplars == 4


def test_text_format_timestamps_are_milliseconds() -> None:
    scrape = read_scrape(FIXTURES / "sglang_t0.prom.txt")
    assert scrape.format == "prometheus-text" and scrape.timestamp_s == 1_700_000_000.0


def test_label_values_keep_escapes_commas_and_braces() -> None:
    scrape = parse_exposition('m{a="x\\"y",b="1,2}",c="line\\nbreak",} 3\n')
    [sample] = scrape.families["m"].samples
    assert dict(sample.labels) == {"a": 'x"y', "b": "1,2}", "c": "line\nbreak"}
    assert scrape.families["m"].type == "untyped"


@pytest.mark.parametrize(("text", "line", "part", "expected"), [
    ("# TYPE a counter\na_total 1\nb 1 2 3\n", 3, "timestamp", "unexpected"),
    ("a{x=\"1} 2\n", 1, "label 'x'", "no closing quote"),
    ("a{x=1} 2\n", 1, "label 'x'", "quoted label value"),
    ("a{x=\"1\" y=\"2\"} 2\n", 1, "labels", "expected ','"),
    ("a{x=\"1\",x=\"2\"} 2\n", 1, "label 'x'", "twice"),
    ("a 1_000\n", 1, "value", "not a number"),
    ("\n\na\n", 3, "value", "has no value"),
    ("a 1 12.5\n", 1, "timestamp", "milliseconds"),
    ("# TYPE a gauge_thing\na 1\n", 1, "type", "unknown metric type"),
    ("a 1\n# TYPE a gauge\n", 2, "type", "after its samples"),
    ("a 1\na 2\n", 2, "sample", "duplicate sample a (first on line 1)"),
    ("a 1\n# EOF\nb 2\n", 3, None, "after '# EOF'"),
    ("# TYPE h histogram\nh_bucket{le=\"x\"} 1\n", 2, "le", "not a number"),
    ("# TYPE h histogram\nh_bucket 1\n", 2, "le", "no 'le' label"),
    ("a 1 # {id=\"r\"}\n", 1, "exemplar", "value"),
    ("9a 1\n", 1, "metric name", "not a metric name"),
])
def test_malformed_expositions_name_the_line_and_the_part(text: str, line: int, part: str | None,
                                                          expected: str) -> None:
    with pytest.raises(ScrapeFormatError) as info:
        parse_exposition(text, "metrics.txt")
    err = info.value
    assert (err.source, err.line, err.part) == ("metrics.txt", line, part)
    assert f"metrics.txt: line {line}" in str(err) and expected in str(err)


def test_an_exposition_without_samples_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ScrapeFormatError, match="no metric samples"):
        parse_exposition("# HELP a b\n\n", "empty.txt")
    (tmp_path / "bin").write_bytes(b"a 1\n\xff\n")
    with pytest.raises(ScrapeFormatError, match="line 2: not UTF-8"):
        read_scrape(tmp_path / "bin")
    with pytest.raises(ScrapeFormatError, match="no such file"):
        read_scrape(tmp_path / "absent")


def _as_set(scrape_text: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    out = set()
    for fam in text_string_to_metric_families(scrape_text):
        for s in fam.samples:
            out.add((s.name, tuple(sorted(s.labels.items())), s.value))
    return out


@pytest.mark.parametrize("relative", [SGLANG, VLLM_T0, "vllm_memory_gap_bsc/llama-2-13b_maxseqs16/"
                                      "vllm_metrics_scrape_t0.prom.txt"])
def test_parser_agrees_with_prometheus_client_on_the_real_files(relative: str) -> None:
    path = _real(relative)
    text = path.read_text()
    ours = {(s.name, s.labels, s.value) for _, s in read_scrape(path).samples()}
    assert ours == _as_set(text)


def test_parser_agrees_with_prometheus_client_on_the_text_fixtures() -> None:
    for name in ("vllm_v0_hand.prom.txt", "tgi_hand.prom.txt", "sglang_t1.prom.txt"):
        path = FIXTURES / name
        ours = {(s.name, s.labels, s.value) for _, s in read_scrape(path).samples()}
        # prometheus_client appends _total to counters exposed without it (TGI's); we keep the exposed
        # name, the one PromQL queries
        theirs = {(n.removesuffix("_total") if n.startswith("tgi_") else n, lb, v)
                  for n, lb, v in _as_set(path.read_text())}
        assert ours == theirs, name


# ---------------------------------------------------------------------------------------------------
# the name table


def test_known_metrics_map_to_the_interval_names_of_definitions() -> None:
    intervals = {"ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s", "prefill_s", "decode_s", "client_ttft_s"}
    assert {m.interval for m in KNOWN_METRICS} <= intervals
    assert len({m.name for m in KNOWN_METRICS}) == len(KNOWN_METRICS)
    # every engine with a latency histogram (llama.cpp has none), NIM, and llmslo's own
    assert {m.server for m in KNOWN_METRICS} == {"vllm", "sglang", "tgi", "trtllm", "nim", "llmslo"}
    ttft = known_metric("vllm:time_to_first_token_seconds_bucket")
    assert ttft is not None and ttft.interval == "ttft_s"
    # vLLM's older "time per output token" histogram is a per-step gap (ITL), not a TPOT
    older = known_metric("vllm:time_per_output_token_seconds")
    assert older is not None and older.interval == "itl_s" and older.per == "engine step"
    tgi = known_metric("tgi_request_mean_time_per_token_duration")
    assert tgi is not None and "includes prefill" in tgi.difference
    assert known_metric("process_cpu_seconds_total") is None


# ---------------------------------------------------------------------------------------------------
# one scrape: real data


def test_sglang_scrape_has_115_lines_and_flags_220_requests_without_a_first_token() -> None:
    path = _real(SGLANG)
    assert len(path.read_text().splitlines()) == 115
    a = analyze_scrape(read_scrape(path), slo={"ttft_s": 2.0, "e2e_s": 2.0})
    assert a.servers == ("sglang",) and dict(a.family_types) == {"counter": 2, "gauge": 6, "histogram": 4}
    counts = {h.metric: h.count for h in a.histograms}
    assert counts["sglang:time_to_first_token_seconds"] == 11_008
    assert counts["sglang:e2e_request_latency_seconds"] == 11_228
    [missing] = _finding(a.findings, "requests_without_first_token")
    assert missing.numbers["requests_without_first_token_at_least"] == 220
    assert "survivor bias" in missing.message
    [queued] = _finding(a.findings, "queued_requests")
    assert queued.numbers["queued"] == 2_826


def test_sglang_ttft_has_no_2s_bound_so_attainment_is_a_range_not_a_number() -> None:
    a = analyze_scrape(read_scrape(_real(SGLANG)), slo={"ttft_s": 2.0, "e2e_s": 2.0})
    [ttft] = [x for x in a.attainment if x.interval == "ttft_s"]
    assert not ttft.exact and ttft.fraction is None
    assert (ttft.bound_below, ttft.bound_above) == (1.0, 2.5)
    assert ttft.lower_fraction == pytest.approx(27 / 11_008) and ttft.upper_fraction == pytest.approx(140 / 11_008)
    assert ttft.missing_requests == 220
    assert ttft.upper_counting_missing == pytest.approx(140 / 11_228)
    assert "no bucket bound equals 2 s" in ttft.message
    [e2e] = [x for x in a.attainment if x.interval == "e2e_s"]
    assert e2e.exact and e2e.fraction == pytest.approx(6 / 11_228)


def test_sglang_ttft_tail_is_mostly_above_the_highest_bound() -> None:
    a = analyze_scrape(read_scrape(_real(SGLANG)))
    [ttft] = [h for h in a.histograms if h.metric == "sglang:time_to_first_token_seconds"]
    assert ttft.above_highest_bound == 11_008 - 2_513
    assert all(q.kind == "at_least" and q.value == 30.0 for q in ttft.quantiles)
    assert ttft.mean == pytest.approx(2.3518979474117756e6 / 11_008)
    tails = [f for f in _finding(a.findings, "tail_above_highest_bound") if "time_to_first_token" in f.message]
    assert len(tails) == 1 and "8,495 of 11,008" in tails[0].message
    [tpot] = [h for h in a.histograms if h.metric == "sglang:time_per_output_token_seconds"]
    assert tpot.per == "streamed chunk" and tpot.quantiles[0].kind == "interpolated"
    assert 0.075 < (tpot.quantiles[0].value or 0) <= 0.1


def test_vllm_startup_scrape_parses_and_holds_no_ttft_histogram() -> None:
    # What the file shows: 12 gauges and 3 counters at start-up, no histogram family at all, so it has no
    # TTFT bucket bounds to check against a 2 s SLO (vLLM 0.6 declares 0.001 ... 1.0, 2.5, ...; see the
    # hand-written vllm_v0_hand fixture).
    scrape = read_scrape(_real(VLLM_T0))
    assert len(scrape.families) == 15 and not scrape.histograms()
    a = analyze_scrape(scrape, slo={"ttft_s": 2.0})
    assert dict(a.family_types) == {"gauge": 12, "counter": 3} and a.servers == ("vllm",)
    assert a.attainment == ()
    [none] = _finding(a.findings, "no_histogram_for_slo")
    assert "2 s SLO on ttft_s cannot be checked" in none.message
    gauges = {n: v for n, _, v in a.gauges}
    assert gauges["vllm:num_requests_waiting"] == 0 and gauges["vllm:cpu_prefix_cache_hit_rate"] == -1.0


# ---------------------------------------------------------------------------------------------------
# one scrape: fixtures


def test_vllm_ttft_buckets_have_no_2s_bound_and_missing_first_tokens_lower_the_range() -> None:
    a = analyze_scrape(read_scrape(FIXTURES / "vllm_v0_hand.prom.txt"), slo={"ttft_s": 2.0, "tpot_s": 0.1})
    [ttft] = a.attainment
    assert 2.0 not in next(h.bounds for h in a.histograms if h.interval == "ttft_s")
    assert (ttft.exact, ttft.lower_fraction, ttft.upper_fraction) == (False, 0.90, 0.97)
    assert ttft.missing_requests == 3
    assert ttft.lower_counting_missing == pytest.approx(90 / 103)
    assert ttft.upper_counting_missing == pytest.approx(97 / 103)
    # vllm:time_per_output_token_seconds is a per-step gap (itl_s): no TPOT histogram to check 100 ms on
    assert any("tpot_s cannot be checked" in f.message for f in _finding(a.findings, "no_histogram_for_slo"))
    [unsuccessful] = _finding(a.findings, "unsuccessful_requests")
    assert unsuccessful.numbers == {"finished": 103, "succeeded": 100}


def test_attainment_is_exact_when_a_bucket_bound_equals_the_threshold() -> None:
    a = analyze_scrape(read_scrape(FIXTURES / "llmslo_openmetrics.txt"), slo={"ttft_s": 2.0, "e2e_s": 5.0})
    by = {x.interval: x for x in a.attainment}
    assert by["ttft_s"].exact and by["ttft_s"].fraction == 0.9 and by["ttft_s"].missing_requests == 0
    assert by["e2e_s"].fraction == 0.7
    assert not _finding(a.findings, "requests_without_first_token")
    [ttft] = [h for h in a.histograms if h.interval == "ttft_s"]
    p50, p90, p99 = ttft.quantiles
    assert p50.value == pytest.approx(2 / 3) and p90.value == pytest.approx(2.0) and p99.kind == "at_least"


def test_tgi_failures_are_missing_from_its_latency_histograms() -> None:
    a = analyze_scrape(read_scrape(FIXTURES / "tgi_hand.prom.txt"), slo={"ttft_s": 2.0, "tpot_s": 0.1})
    [unsuccessful] = _finding(a.findings, "unsuccessful_requests")
    assert unsuccessful.numbers == {"requests": 120, "succeeded": 100, "failed": 20}
    assert _finding(a.findings, "requests_without_duration")
    [tpot] = a.attainment
    assert tpot.fraction == 0.8 and "includes prefill" in tpot.message
    assert any("ttft_s cannot be checked" in f.message for f in _finding(a.findings, "no_histogram_for_slo"))


def test_a_non_cumulative_histogram_is_reported_and_not_estimated() -> None:
    text = ("# TYPE h histogram\nh_bucket{le=\"1\"} 5\nh_bucket{le=\"2\"} 3\nh_bucket{le=\"+Inf\"} 6\n"
            "h_count 7\nh_sum 4\n")
    a = analyze_scrape(parse_exposition(text))
    [h] = a.histograms
    assert all(q.value is None for q in h.quantiles)
    assert "not cumulative" in h.problems[0] and "_count 7 differs" in h.problems[1]
    assert _finding(a.findings, "malformed_histogram")


def test_analysis_json_is_serialisable_with_infinite_bounds() -> None:
    a = analyze_scrape(read_scrape(FIXTURES / "llmslo_openmetrics.txt"), slo={"ttft_s": 2.0})
    doc = json.loads(json.dumps(a.to_dict()))
    ttft = doc["histograms"][0]
    assert ttft["quantiles"]["p99"]["bucket_upper"] == "+Inf"
    assert ttft["exemplars"][2]["le"] == "+Inf"
    assert "bucket estimates" in doc["quantile_note"]


def test_bad_slo_thresholds_and_quantiles_are_refused() -> None:
    scrape = read_scrape(FIXTURES / "tgi_hand.prom.txt")
    with pytest.raises(ValueError, match="positive"):
        analyze_scrape(scrape, slo={"ttft_s": 0.0})
    with pytest.raises(ValueError, match="within"):
        analyze_scrape(scrape, quantiles=(0.5, 99.0))


# ---------------------------------------------------------------------------------------------------
# two scrapes


def test_two_scrapes_give_counter_rates_over_the_sample_timestamps() -> None:
    r = compare_scrapes(read_scrape(FIXTURES / "sglang_t0.prom.txt"), read_scrape(FIXTURES / "sglang_t1.prom.txt"),
                        slo={"ttft_s": 2.0})
    assert (r.interval_s, r.interval_basis) == (60.0, "sample timestamps")
    rates = {c.name: c for c in r.counters}
    gen = rates["sglang:generation_tokens_total"]
    assert (gen.increase, gen.rate_per_s, gen.reset) == (6000.0, 100.0, False)


def test_a_counter_that_fell_is_a_reset_and_its_increase_is_the_value_after() -> None:
    r = compare_scrapes(read_scrape(FIXTURES / "sglang_t0.prom.txt"), read_scrape(FIXTURES / "sglang_t1.prom.txt"))
    prompt = next(c for c in r.counters if c.name == "sglang:prompt_tokens_total")
    assert (prompt.reset, prompt.increase) == (True, 2000.0) and prompt.rate_per_s == pytest.approx(2000 / 60)
    assert _finding(r.findings, "counter_reset")


def test_interval_histograms_are_bucket_increases_with_their_own_survivor_check() -> None:
    r = compare_scrapes(read_scrape(FIXTURES / "sglang_t0.prom.txt"), read_scrape(FIXTURES / "sglang_t1.prom.txt"),
                        slo={"ttft_s": 2.0})
    ttft = next(h for h in r.histograms if h.interval == "ttft_s")
    assert ttft.count == 30 and ttft.mean == pytest.approx(45 / 30)
    assert ttft.quantiles[0].value == pytest.approx(1.0 + (15 - 10) / 20)
    [missing] = _finding(r.findings, "requests_without_first_token")
    assert missing.numbers["requests_without_first_token_at_least"] == 5
    [att] = r.attainment
    assert att.fraction == 1.0 and att.fraction_counting_missing == pytest.approx(30 / 35)
    assert _finding(r.findings, "queued_requests")  # 12 queued at the later scrape


def test_a_changed_created_time_is_a_reset_even_when_the_value_grew() -> None:
    before = parse_exposition("# TYPE c counter\nc_total 10\nc_created 100\n# EOF\n", "a")
    after = parse_exposition("# TYPE c counter\nc_total 15\nc_created 200\n# EOF\n", "b")
    [c] = compare_scrapes(before, after, interval_s=5).counters
    assert (c.reset, c.increase, c.rate_per_s) == (True, 15.0, 3.0)


def test_a_histogram_that_restarted_is_taken_whole() -> None:
    head = "# TYPE h histogram\n"
    before = parse_exposition(head + 'h_bucket{le="1"} 50\nh_bucket{le="+Inf"} 60\nh_count 60\n', "a")
    after = parse_exposition(head + 'h_bucket{le="1"} 4\nh_bucket{le="+Inf"} 5\nh_count 5\n', "b")
    r = compare_scrapes(before, after, interval_s=10)
    assert r.histograms[0].count == 5 and _finding(r.findings, "histogram_reset")


def test_series_that_appear_or_vanish_are_reported() -> None:
    before = parse_exposition("# TYPE a_total counter\na_total 1\n# TYPE b_total counter\nb_total 4\n", "a")
    after = parse_exposition("# TYPE a_total counter\na_total 3\n# TYPE c_total counter\nc_total 7\n", "b")
    r = compare_scrapes(before, after, interval_s=2)
    c = next(x for x in r.counters if x.name == "c_total")
    assert c.appeared and c.increase == 7
    assert r.vanished == ("b_total",)


def test_two_scrapes_without_timestamps_need_an_interval() -> None:
    a = read_scrape(FIXTURES / "tgi_hand.prom.txt")
    with pytest.raises(ScrapeFormatError, match=r"no timestamps.*--interval-s"):
        compare_scrapes(a, a)
    assert compare_scrapes(a, a, interval_s=30).interval_basis == "given"


def test_scrapes_given_in_the_wrong_order_are_refused() -> None:
    t0, t1 = read_scrape(FIXTURES / "sglang_t0.prom.txt"), read_scrape(FIXTURES / "sglang_t1.prom.txt")
    with pytest.raises(ScrapeFormatError, match="not later"):
        compare_scrapes(t1, t0)


# ---------------------------------------------------------------------------------------------------
# the command


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("scrape")(scrape_command)
    app.command("noop")(lambda: None)
    return app


def test_scrape_command_prints_json_for_the_sglang_example() -> None:
    res = CliRunner().invoke(_app(), ["scrape", str(_real(SGLANG)), "--ttft", "2s", "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    checks = {f["check"] for f in doc["findings"]}
    assert {"requests_without_first_token", "queued_requests"} <= checks
    [ttft] = [a for a in doc["slo_attainment"] if a["interval"] == "ttft_s"]
    assert ttft["exact"] is False and ttft["threshold_s"] == 2.0


def test_scrape_command_prints_tables_for_a_person() -> None:
    res = CliRunner().invoke(_app(), ["scrape", str(FIXTURES / "vllm_v0_hand.prom.txt"), "--tpot", "off"])
    assert res.exit_code == 0, res.stderr
    assert "bucket estimates" in res.stdout and "no bucket bound equals 2 s" in res.stdout
    assert "requests ended without a first token" in res.stdout and "Definitions" in res.stdout


def test_scrape_command_with_two_files_prints_rates() -> None:
    res = CliRunner().invoke(_app(), ["scrape", str(FIXTURES / "sglang_t0.prom.txt"),
                                      str(FIXTURES / "sglang_t1.prom.txt"), "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["interval_s"] == 60.0 and any(c["reset"] for c in doc["counters"])


def test_scrape_command_asks_for_the_interval_when_files_have_no_timestamps() -> None:
    tgi = str(FIXTURES / "tgi_hand.prom.txt")
    res = CliRunner().invoke(_app(), ["scrape", tgi, tgi])
    assert res.exit_code == 1 and "--interval-s" in res.stderr and "no sample timestamps" in res.stderr
    ok = CliRunner().invoke(_app(), ["scrape", tgi, tgi, "--interval-s", "15", "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["interval_basis"] == "given"


@pytest.mark.parametrize(("args", "code", "expected"), [
    (["--ttft", "soon"], 2, "--ttft"),
    (["--interval-s", "5"], 2, "needs a second file"),
])
def test_scrape_command_refuses_bad_options(args: list[str], code: int, expected: str) -> None:
    res = CliRunner().invoke(_app(), ["scrape", str(FIXTURES / "tgi_hand.prom.txt"), *args])
    assert res.exit_code == code and expected in res.stderr


def test_scrape_command_names_the_line_of_a_malformed_file(tmp_path: Path) -> None:
    bad = tmp_path / "m.txt"
    bad.write_text("a 1\nb{x=\"1} 2\n")
    res = CliRunner().invoke(_app(), ["scrape", str(bad)])
    assert res.exit_code == 1 and f"{bad}: line 2" in res.stderr


def test_llmslo_own_exposition_is_read_with_the_catalogue_names() -> None:
    from llmslo.telemetry import Telemetry, render_metrics

    tel = Telemetry(version="v1")
    t = tel.start("req-1", model="m", prompt_tokens=10)
    t.admit()
    t.schedule()
    for _ in range(3):
        t.commit()
        t.send()
    t.finish("stop")
    body, _ = render_metrics(tel.registry, "application/openmetrics-text; version=1.0.0")
    analysis = analyze_scrape(parse_exposition(body.decode(), "llmslo /metrics"))
    by_interval = {h.interval: h for h in analysis.histograms if h.server == "llmslo" and h.count}
    assert {"ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s"} <= set(by_interval)
    assert by_interval["ttft_s"].count == 1 and by_interval["itl_s"].count == 2


def _serve(tel: object, ids: range) -> None:
    from llmslo.telemetry import Telemetry

    assert isinstance(tel, Telemetry)
    for i in ids:
        t = tel.start(f"req-{i}", model="llama", prompt_tokens=8)
        t.admit()
        t.schedule()
        for _ in range(3):
            t.commit()
            t.send()
        t.finish("stop")


def test_two_openmetrics_scrapes_of_llmslo_with_exemplars_are_compared(tmp_path: Path) -> None:
    from llmslo.telemetry import Telemetry, render_metrics

    ticks = iter(range(1_000_000_000, 10**13, 7_000_000))  # 7 ms per clock reading
    tel = Telemetry(clock_ns=lambda: next(ticks), clock_unix_s=lambda: 1_700_000_000.0, version="v1")
    openmetrics = "application/openmetrics-text; version=1.0.0"
    _serve(tel, range(3))
    before = tmp_path / "t0.om.txt"
    before.write_bytes(render_metrics(tel.registry, openmetrics)[0])
    _serve(tel, range(3, 7))
    after = tmp_path / "t1.om.txt"
    after.write_bytes(render_metrics(tel.registry, openmetrics)[0])
    first, second = read_scrape(before), read_scrape(after)
    assert first.format == second.format == "openmetrics"
    assert analyze_scrape(first).exemplars > 0 and analyze_scrape(second).exemplars > 0

    rates = compare_scrapes(first, second, interval_s=10.0)
    [ttft] = [h for h in rates.histograms if h.interval == "ttft_s"]
    assert ttft.count == 4
    old = {e for h in first.histograms() for e in h.exemplars}
    assert ttft.exemplars and not old & set(ttft.exemplars)  # only the exemplars of the interval's requests
    assert {e.labels["request_id"] for _, e in ttft.exemplars} <= {f"req-{i}" for i in range(3, 7)}

    res = CliRunner().invoke(_app(), ["scrape", str(before), str(after), "--interval-s", "10"])
    assert res.exit_code == 0, res.stderr
    assert "Counter rates over the interval" in res.stdout and "llmslo_ttft_seconds" in res.stdout
    res = CliRunner().invoke(_app(), ["scrape", str(before), str(after), "--interval-s", "10", "--json"])
    assert res.exit_code == 0, res.stderr
    [doc] = [h for h in json.loads(res.stdout)["histograms"] if h["interval"] == "ttft_s"]
    assert doc["count"] == 4


ODD_LABELS = ("[/nonexistent]", "[link=http://x]y", "\x1b[31m")


def _odd(path: Path, value: float) -> Path:
    """A vLLM-like exposition whose ``model_name`` label values are rich markup and a terminal escape."""
    lines = ["# TYPE vllm:num_requests_running gauge", "# TYPE vllm:prompt_tokens_total counter"]
    for i, label in enumerate(ODD_LABELS):
        lines.append(f'vllm:num_requests_running{{model_name="{label}"}} {i}')
        lines.append(f'vllm:prompt_tokens_total{{model_name="{label}"}} {value + i}')
    path.write_text("\n".join(lines) + "\n")
    return path


def test_label_values_are_shown_literally_in_every_table(tmp_path: Path) -> None:
    before, after = _odd(tmp_path / "odd [b] t0.txt", 10.0), _odd(tmp_path / "odd [b] t1.txt", 20.0)
    for args in ([str(before)], [str(before), str(after), "--interval-s", "10"]):
        res = CliRunner().invoke(_app(), ["scrape", *args])
        assert res.exit_code == 0, res.output
        out = res.stdout
        assert "model_name=[/nonexistent]" in out and "model_name=[link=http://x]y" in out
        assert "model_name=\\x1b[31m" in out and "\x1b" not in out
        assert "odd [b] t0.txt" in out
