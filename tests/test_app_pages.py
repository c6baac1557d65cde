"""The app's pages under ``streamlit.testing.v1.AppTest``: every figure equals the llmslo command's JSON on the
same store and options, the sidebar's thresholds and filters change them, and the pages hold up on an empty
store, a store without arrival times and hostile labels."""

from __future__ import annotations

import ast
import datetime as dt
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import polars as pl
import pytest
from streamlit.testing.v1 import AppTest

from llmslo.analysis import Store
from llmslo.analysis.importers import import_files
from llmslo.tests._app_store import ENTRY, HOSTILE, T0, WINDOW_S, add_gpu, add_update, app_rows, argv, cli_json, ingest

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MARKDOWN = ("markdown", "caption", "error", "warning", "info", "title", "subheader")
"""AppTest's elements whose text Streamlit renders as Markdown."""
PAGES = ["_page_overview.py", "_page_latency.py", "_page_survivor.py", "_page_anomalies.py", "_page_gpu.py",
         "_page_rollouts.py", "_page_data.py"]


class App:
    """An AppTest of the app over ``db`` (its script arguments set around every run)."""

    def __init__(self, db: Path | None) -> None:
        self.db = db
        self.at = AppTest.from_file(str(ENTRY), default_timeout=60)
        self.ran = False

    def run(self) -> AppTest:
        with argv(self.db):
            self.at.run()
        self.ran = True
        assert not self.at.exception, [e.value for e in self.at.exception]
        return self.at

    def page(self, script: str) -> AppTest:
        self.at.switch_page(script)
        return self.run()

    def set(self, kind: str, key: str, value: Any) -> AppTest:
        if not self.ran:  # widgets exist only once the script has run
            self.run()
        getattr(self.at, kind)(key=key).set_value(value)
        return self.run()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    db = ingest(tmp_path / "app.duckdb", app_rows())
    add_gpu(db)
    add_update(db)
    return db


def _frame(at: AppTest, column: str) -> pd.DataFrame:
    """The first table on the page that has ``column``."""
    for d in at.dataframe:
        if column in d.value.columns:
            return d.value.reset_index(drop=True)
    raise AssertionError(f"no table with a {column!r} column; tables: {[list(d.value.columns) for d in at.dataframe]}")


def _same(shown: Any, expected: Any) -> bool:
    """A table cell equals a JSON value (null as NaN/None), exactly."""
    if expected is None:
        return shown is None or (isinstance(shown, float) and math.isnan(shown))
    return bool(shown == expected)


def _text(at: AppTest) -> str:
    """Everything the page wrote as text, code, caption, Markdown, alerts and metrics."""
    parts: list[str] = []
    for kind in ("text", "code", "caption", "markdown", "error", "warning", "info", "title", "subheader"):
        parts += [str(e.value) for e in getattr(at, kind)]
    parts += [f"{m.label} {m.value}" for m in at.metric]
    return "\n".join(parts)


def test_overview_shows_the_report_json_per_window_and_in_total(store: Path) -> None:
    app = App(store)
    at = app.set("text_input", "window", "1m")
    whole = cli_json("report", "--db", str(store), "--json")
    windows = cli_json("report", "--db", str(store), "--window", "1m", "--json")
    metrics = {m.label: m.value for m in at.metric}
    t = whole["totals"]
    assert metrics["Attempted"] == f"{t['attempted']:,}" and metrics["Good"] == f"{t['good']:,}"
    assert metrics["In flight"] == f"{t['in_flight']:,}"
    assert metrics["Goodput fraction (good / settled)"] == f"{t['goodput_fraction']:.1%}"
    assert windows["policy"]["rule"] in [c.value for c in at.code]  # the policy beside the figures
    table = _frame(at, "goodput_fraction")
    assert len(table) == len(windows["groups"]) == 3
    for row, g in zip(table.to_dict("records"), windows["groups"], strict=True):
        assert row["window_start_unix_s"] == g["keys"]["window_start_unix_s"]
        for key in ("attempted", "good", "in_flight", "goodput_fraction", "request_goodput_per_s",
                    "token_goodput_per_s"):
            assert _same(row[key], g[key]), (key, row[key], g[key])
        sb = g["survivor_bias"]
        assert row["verdict"] == sb["verdict"] and _same(row["shed_cancel_fraction"], sb["shed_cancel_fraction"])
        assert all(row[f"n_{r}"] == n for r, n in g["finish_reasons"].items())
    assert list(table["verdict"]) == ["consistent", "optimistic", "consistent"]  # the burst flatters success-only
    assert len(at.get("vega_lite_chart")) == 4  # goodput, attempted vs good, finish reasons, verdicts


def test_changing_a_threshold_changes_the_policy_and_every_figure(store: Path) -> None:
    app = App(store)
    app.set("text_input", "window", "1m")
    at = app.set("text_input", "slo_ttft", "300ms")
    at = app.set("text_input", "slo_tpot", "off")
    expected = cli_json("report", "--db", str(store), "--window", "1m", "--ttft", "300ms", "--tpot", "off", "--json")
    (code,) = [c.value for c in at.code]
    assert code == expected["policy"]["rule"] and "ttft_s <= 300ms" in code and "tpot_s" not in code
    table = _frame(at, "goodput_fraction")
    assert [int(x) for x in table["good"]] == [g["good"] for g in expected["groups"]]
    assert all(_same(a, g["goodput_fraction"]) for a, g in zip(table["goodput_fraction"], expected["groups"],
                                                               strict=True))
    assert {m.label: m.value for m in at.metric}["Good"] == f"{sum(g['good'] for g in expected['groups']):,}"


def test_a_threshold_that_is_no_duration_is_named_and_nothing_is_shown(store: Path) -> None:
    at = App(store).set("text_input", "slo_ttft", "fast")
    (error,) = [e.value for e in at.error]
    assert "TTFT SLO" in error and "fast" in error and "off" in error
    assert not at.dataframe and not at.metric  # no figure under a policy that could not be built


def test_latency_quantiles_by_model_equal_the_report(store: Path) -> None:
    app = App(store)
    app.run()
    at = app.page("_page_latency.py")
    at = app.set("selectbox", "latency_by", "model")
    expected = cli_json("report", "--db", str(store), "--by", "model", "--json")
    table = _frame(at, "p99_s")
    rows = {(r["model"], r["interval"]): r for r in table.to_dict("records")}
    intervals = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s")
    assert len(rows) == len(expected["groups"]) * len(intervals)
    thresholds = {"ttft_s": expected["policy"]["ttft_s"], "tpot_s": expected["policy"]["tpot_s"]}
    for g in expected["groups"]:
        model = g["keys"]["model"].replace("\x1b", "\\x1b")  # control characters are shown as code points
        for name in intervals:
            d, row = g["latency"][name], rows[(model, name)]
            for key in ("count", "mean", "p50", "p90", "p95", "p99", "max"):
                assert _same(row[key if key == "count" else f"{key}_s"], d[key]), (model, name, key)
            if name in thresholds and d["count"]:
                at_bound = next(b["count"] for b in d["buckets"] if b["le"] == thresholds[name])
                assert row["within_slo"] == at_bound / d["count"]
    specs = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]
    assert len(specs) >= 2 * len(intervals)  # histogram and ECDF per interval, and client vs server
    ttft_ecdf = next(s for s in specs if "layer" in s and s["layer"][0]["title"] == "ttft_s: empirical CDF")
    assert [layer["mark"]["type"] for layer in ttft_ecdf["layer"]] == ["line", "rule"]  # the SLO is drawn
    client = _frame(at, "interval")  # the quantile table; the client vs server one follows it
    assert {"ttft_s", "client_ttft_s"} <= set(at.dataframe[1].value["interval"]) and len(client)


def test_survivor_page_equals_the_report_per_window(store: Path) -> None:
    app = App(store)
    app.set("text_input", "window", "1m")
    at = app.page("_page_survivor.py")
    expected = cli_json("report", "--db", str(store), "--window", "1m", "--json")
    table = _frame(at, "censoring_aware_p99_s")
    for row, g in zip(table.to_dict("records"), expected["groups"], strict=True):
        sb = g["survivor_bias"]
        so, ca = sb["ttft_success_only"], sb["ttft_censoring_aware"]
        assert row["success_only_n"] == so["count"] and row["censored"] == ca["censored"]
        for q in ("p50", "p90", "p99"):
            assert _same(row[f"success_only_{q}_s"], so[q]) and _same(row[f"censoring_aware_{q}_s"], ca[q])
        assert _same(row["at_least_s"], ca["at_least_s"]) and row["verdict"] == sb["verdict"]
        assert _same(row["shed_cancel_fraction"], sb["shed_cancel_fraction"])
    burst = table.to_dict("records")[1]
    assert burst["censoring_aware_p99_s"] is None or math.isnan(burst["censoring_aware_p99_s"])
    assert burst["at_least_s"] == 9.0  # those who gave up waited 9 s: TTFT at least that
    assert "shed/cancel fraction rose" in burst["reasons"]


def test_filters_narrow_every_figure_to_the_selected_rows(store: Path, tmp_path: Path) -> None:
    rows = app_rows()
    only_m1 = ingest(tmp_path / "m1.duckdb", [r for r in rows if r["model"] == "m1"])
    later = ingest(tmp_path / "later.duckdb", [r for r in rows if r["arrival_unix_s"] >= T0 + WINDOW_S])
    app = App(store)
    app.set("text_input", "window", "1m")
    at = app.set("multiselect", "filter_model", ["m1"])
    assert "model in {m1}" in _text(at)
    expected = cli_json("report", "--db", str(only_m1), "--window", "1m", "--json")
    assert [int(x) for x in _frame(at, "goodput_fraction")["attempted"]] == [g["attempted"] for g in expected["groups"]]
    app.set("multiselect", "filter_model", [])
    slider = app.at.slider(key="time_range")
    start = dt.datetime.fromtimestamp(T0 + WINDOW_S, dt.UTC).replace(tzinfo=None)
    at = app.set("slider", "time_range", (start, slider.value[1]))
    expected = cli_json("report", "--db", str(later), "--window", "1m", "--json")
    table = _frame(at, "goodput_fraction")
    assert [int(x) for x in table["attempted"]] == [g["attempted"] for g in expected["groups"]]
    assert list(table["verdict"]) == [g["survivor_bias"]["verdict"] for g in expected["groups"]]
    assert {m.label: m.value for m in at.metric}["Attempted"] == f"{expected['totals']['attempted']:,}"


def test_every_page_draws_on_an_empty_store(tmp_path: Path) -> None:
    app = App(ingest(tmp_path / "empty.duckdb", []))
    at = app.run()
    assert any("No request summaries" in i.value for i in at.info)
    assert {m.label: m.value for m in at.metric}["Attempted"] == "0"
    for script in PAGES[1:]:
        at = app.page(script)
        assert not at.error, (script, [e.value for e in at.error])
        assert at.info or at.text, script  # each says what it has, or that there is nothing


def test_pages_say_what_they_cannot_show_without_arrival_times(tmp_path: Path) -> None:
    db = tmp_path / "bench.duckdb"
    import_files([FIXTURES / "import" / "vllm_benchmark_serving_old.json"], "auto", db)
    expected = cli_json("report", "--db", str(db), "--json")
    app = App(db)
    at = app.run()
    assert {m.label: m.value for m in at.metric}["Attempted"] == f"{expected['totals']['attempted']:,}"
    assert any("no arrival times" in i.value and "windows" in i.value for i in at.info)
    assert all(c in _text(at) for c in expected["caveats"])
    assert app.at.slider.len == 0  # no time range to choose
    at = app.page("_page_survivor.py")
    assert any("cannot be made per window" in i.value for i in at.info)
    table = _frame(at, "censoring_aware_p99_s")
    (g,) = expected["groups"]
    assert table.loc[0, "verdict"] == g["survivor_bias"]["verdict"]
    at = app.page("_page_anomalies.py")
    assert "cannot be placed in windows" in _text(at)
    at = app.page("_page_gpu.py")
    assert any("No GPU or engine samples" in i.value for i in at.info)
    at = app.page("_page_data.py")
    imports = _frame(at, "arrivals_available")
    assert list(imports["arrivals_available"]) == [False]
    assert f"Request summaries: {expected['totals']['requests']:,}, of which 0 carry arrival times" in _text(at)


def test_a_store_with_and_without_arrival_times_shows_the_placed_rows_by_window(store: Path) -> None:
    placed = cli_json("report", "--db", str(store), "--window", "1m", "--json")["groups"]  # before the import
    import_files([FIXTURES / "import" / "vllm_benchmark_serving_old.json"], "auto", store)
    expected = cli_json("report", "--db", str(store), "--window", "1m", "--json")
    assert len(expected["groups"]) == len(placed) + 1  # the report gives the imported rows a window of their own
    app = App(store)
    at = app.set("text_input", "window", "1m")
    table = _frame(at, "goodput_fraction")
    assert list(table["window_start_unix_s"]) == [g["keys"]["window_start_unix_s"] for g in placed]
    assert [int(x) for x in table["attempted"]] == [g["attempted"] for g in placed]
    assert "fit no window and are left out of the windows" in _text(at)
    assert {m.label: m.value for m in at.metric}["Attempted"] == f"{sum(g['attempted'] for g in expected['groups']):,}"


def test_hostile_labels_show_literally_everywhere(store: Path) -> None:
    app = App(store)
    at = app.set("text_input", "window", "1m")
    options = app.at.multiselect(key="filter_model").options
    assert {HOSTILE[0], HOSTILE[1], "red\\x1b[31mtext"} <= set(options)
    seen: list[str] = []
    for script in PAGES:
        at = app.page(script)
        seen += [str(v) for d in at.dataframe for v in d.value.astype(str).to_numpy().ravel()]
        assert "\x1b" not in _text(at), script
        for kind in MARKDOWN:  # an element that renders Markdown never holds a label as written
            assert not any(h in str(e.value) for e in getattr(at, kind) for h in HOSTILE[:2]), (script, kind)
    at = app.page("_page_latency.py")
    at = app.set("selectbox", "latency_by", "model")
    models = set(_frame(at, "p99_s")["model"])
    assert {HOSTILE[0], HOSTILE[1], "red\\x1b[31mtext"} <= models  # as written, the escape made visible
    data = app.page("_page_data.py")
    values = set(_frame(data, "value")["value"])
    assert {HOSTILE[0], HOSTILE[1], "red\\x1b[31mtext"} <= values
    assert not any("\x1b" in v for v in seen)


def test_a_hostile_filter_value_selects_exactly_its_rows(store: Path) -> None:
    app = App(store)
    app.run()
    at = app.set("multiselect", "filter_model", [HOSTILE[0]])
    assert {m.label: m.value for m in at.metric}["Attempted"] == "5"
    assert f"model in {{{HOSTILE[0]}}}" in _text(at)


@pytest.mark.parametrize(("make", "words"), [
    (lambda p: p.write_text("not a database\n"), "cannot open store"),
    (lambda p: None, "no store at"),
])
def test_a_path_that_holds_no_store_gives_a_message_not_a_traceback(tmp_path: Path, make: Any, words: str) -> None:
    path = tmp_path / "x.duckdb"
    make(path)
    at = App(path).run()
    (error,) = [e.value for e in at.error]
    assert words in error.replace("\\", "") and "Traceback" not in error
    assert not path.exists() or path.read_text() == "not a database\n"  # nothing written, nothing created


def test_without_a_store_argument_the_app_says_how_to_start_it() -> None:
    at = App(None).run()
    (error,) = [e.value for e in at.error]
    assert "llmslo app --db" in error.replace("\\", "")


def test_gpu_page_equals_gpu_correlate(store: Path) -> None:
    app = App(store)
    app.run()
    at = app.page("_page_gpu.py")
    expected = cli_json("gpu", "correlate", "--db", str(store), "--json")
    table = _frame(at, "pearson")
    shown = {(r["signal"], r["target"]): r for r in table.to_dict("records")}
    assert len(shown) == len(expected["correlations"]) > 0
    for c in expected["correlations"]:
        row = shown[(c["signal"], c["target"])]
        assert all(_same(row[k], c[k]) for k in ("n", "pearson", "pearson_p", "spearman", "spearman_p"))
    for lag in expected["lags"]:
        assert shown[(lag["a"], lag["b"])]["best_lag_s"] == lag["best_lag_s"]
    assert len(at.get("vega_lite_chart")) == 1


def test_rollouts_page_equals_rollout_compare(store: Path) -> None:
    app = App(store)
    app.run()
    at = app.page("_page_rollouts.py")
    expected = cli_json("rollout", "compare", "--db", str(store), "--update", "u-1", "--json")
    assert f"Verdict: {expected['verdict']}" in _text(at)
    assert all(r in _text(at) for r in expected["reasons"])
    updates = _frame(at, "update_id")
    assert list(updates["update_id"]) == ["u-1"] and updates.loc[0, "wait_budget_s"] == 120.0
    outcomes = _frame(at, "outcome_population")
    for row, o in zip(outcomes.to_dict("records"), expected["outcomes"], strict=True):
        assert (row["version"], row["side"], row["attempted"], row["good"]) == (o["version"], o["side"],
                                                                                  o["attempted"], o["good"])
    assert expected["policy"]["rule"] in [c.value for c in at.code]


def _shifted_store(path: Path) -> Path:
    """Two hours at one request a second, TTFT three times as long over 20 minutes from T0 + 90 min."""
    rng = np.random.default_rng(3)
    n = 7200
    t = T0 + np.arange(n, dtype=np.float64)
    ttft = 0.3 * np.exp(0.2 * rng.standard_normal(n)) * np.where((t >= T0 + 5400) & (t < T0 + 6600), 3.0, 1.0)
    frame = pl.DataFrame({"request_id": [f"s{i}" for i in range(n)], "model": "m1", "version": "v1",
                          "tenant_class": "interactive", "arrival_unix_s": t, "finish_reason": "stop",
                          "queue_s": ttft / 4, "ttft_s": ttft, "last_token_s": ttft + 1.0, "e2e_s": ttft + 1.1,
                          "prompt_tokens": 100, "generated_tokens": 11, "sent_tokens": 11})
    with Store.open(path) as store:
        store.ingest_frame(frame)
    return path


def test_anomalies_page_shows_the_scans_windows_and_findings(tmp_path: Path) -> None:
    db = _shifted_store(tmp_path / "shift.duckdb")
    app = App(db)
    app.run()
    at = app.page("_page_anomalies.py")
    expected = cli_json("anomalies", "--db", str(db), "--json")
    findings = _frame(at, "p99_before_s")
    assert len(findings) == len(expected["findings"]) >= 1
    for row, f in zip(findings.to_dict("records"), expected["findings"], strict=True):
        assert row["series"] == f["series"] and row["windows"] == f["windows"]
        assert all(_same(row[k], f[k]) for k in ("statistic", "p_adjusted", "p50_before_s", "p50_after_s",
                                                 "p99_before_s", "p99_after_s"))
        assert (row["n_after"], row["n_before"]) == (f["n_run"], f["n_before"])
    windows = _frame(at, "status")
    assert len(windows) == sum(s["windows"] for s in expected["series"].values())
    assert (windows["status"] == "in a finding").sum() >= 2
    assert len(at.get("vega_lite_chart")) == 1


def _top_level_values(path: Path) -> Iterator[int]:
    """Lines of the bare values (not calls) at the top level of a script, the module docstring apart."""
    body = ast.parse(path.read_text()).body
    for i, node in enumerate(body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if isinstance(node, ast.Expr) and not docstring and not isinstance(node.value, ast.Call):
            yield node.lineno


@pytest.mark.parametrize("script", [*PAGES, "streamlit_app.py"])
def test_page_scripts_hold_no_bare_value_that_streamlit_magic_would_draw(script: str) -> None:
    path = ENTRY.parent / script
    assert not list(_top_level_values(path)), f"{script}: a bare value at the top level is drawn on the page"
