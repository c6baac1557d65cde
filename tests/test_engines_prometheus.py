"""Every PromQL expression of the engine rules and dashboards, run by a real Prometheus on real expositions.

The expositions are the engines' own ``/metrics`` in ``../shared/real_data/prometheus`` (``SOURCES.md`` says
which engine and version each file is): vLLM, SGLang (two), TGI, llama.cpp's llama-server (two). NVIDIA NIM's
file is not one of the ``--engine`` engines. There is **no trtllm-serve exposition** there, so trtllm's rules are
proven by promtool alone (``tests/test_rules_engines.py``). The files are never copied into the repository.

Each file is served over HTTP on 127.0.0.1 and scraped every second by one Prometheus (Debian's package) with the
rules ``llmslo rules generate --engine`` makes for a spec of everything the engine supports (thresholds on
bucket bounds the file holds). So that rates are positive and every SLO ratio is defined, the n-th scrape of a
file answers its counters, histogram buckets, counts and sums multiplied by n (the same traffic again each
scrape); gauges, names, labels, types and ``le`` spellings are the file's own. Then: every rule is evaluated by
Prometheus without error; every recording rule of an SLO whose series the file holds yields a series; every
alert expression runs; every panel query of the engine's dashboards runs, and returns data when the file holds
the series it reads (alert-state queries excepted: nothing fires); every variable look-up lists values. A series
the file lacks must be one of the engine's own names (the TGI file is a prefix of a real scrape), never a typo.
Skipped without ``../shared/real_data`` (saying so) or without the ``prometheus`` binary (failed under CI).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from llmslo.dashboards import Dashboard, build_dashboards, panel_queries, variable_queries
from llmslo.engines import ENGINES, EngineProfile
from llmslo.ops import Prometheus, PrometheusError, running_prometheus
from llmslo.rules import Model, build_model, generate_groups, parse_spec, render
from llmslo.tests._dashboards import LABEL_VALUES, promql_names
from llmslo.tests._engine_specs import engine_spec
from llmslo.tests._tools import require_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REAL = Path(__file__).resolve().parents[2] / "shared" / "real_data" / "prometheus"
ENGINE_OF_PREFIX = {"vllm_": "vllm", "sglang_": "sglang", "tgi_": "tgi", "llamacpp_": "llamacpp"}
"""File-name prefix -> engine key (``SOURCES.md`` names each file's engine; checked below)."""
NAMED_IN_SOURCES = {"vllm": "vLLM", "sglang": "SGLang", "tgi": "TGI", "llamacpp": "llama.cpp"}
JOB = "engines"
RATE_INTERVAL = "10s"
"""What Grafana would put for ``$__rate_interval`` here (scrapes every second)."""
WAIT_S = 45.0


def _real() -> Path:
    if not (REAL / "SOURCES.md").exists():
        pytest.skip(f"real expositions not available: {REAL} (../shared/real_data is missing)")
    return REAL


def engine_files(folder: Path) -> dict[str, list[Path]]:
    """The expositions of the ``--engine`` engines, by engine key."""
    out: dict[str, list[Path]] = {}
    for path in sorted(folder.glob("*.prom.txt")):
        key = next((k for prefix, k in ENGINE_OF_PREFIX.items() if path.name.startswith(prefix)), None)
        if key is not None:
            out.setdefault(key, []).append(path)
    return out


_TYPE = re.compile(r"^# TYPE (\S+) (\S+)")
_NAME = re.compile(r"^[^{\s]+")
_LE = re.compile(r'le="([^"]+)"')


def _types(text: str) -> dict[str, str]:
    return {m[1]: m[2] for line in text.splitlines() if (m := _TYPE.match(line))}


def _kind(name: str, types: dict[str, str]) -> str | None:
    if name in types:
        return types[name]
    for suffix in ("_bucket", "_count", "_sum", "_total"):
        if name.endswith(suffix) and name.removesuffix(suffix) in types:
            return types[name.removesuffix(suffix)]
    return None


def scaled(text: str, factor: int) -> str:
    """``text`` with every counter, histogram and summary sum/count sample multiplied by ``factor``."""
    types = _types(text)
    out = []
    for line in text.splitlines():
        match = _NAME.match(line)
        if match is not None and not line.startswith("#"):
            name = match.group()
            kind = _kind(name, types)
            cumulative = kind in ("counter", "histogram") or (kind == "summary" and name != _base(name, types))
            if cumulative:
                head, value = line.rsplit(None, 1)
                line = f"{head} {float(value) * factor!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def _base(name: str, types: dict[str, str]) -> str:
    return name if name in types else re.sub(r"_(sum|count)$", "", name)


def sample_names(paths: list[Path]) -> set[str]:
    return {m.group() for p in paths for line in p.read_text().splitlines()
            if not line.startswith("#") and (m := _NAME.match(line))}


def bounds(paths: list[Path]) -> dict[str, set[float]]:
    """Histogram family -> the finite ``le`` bounds the files hold."""
    out: dict[str, set[float]] = {}
    for p in paths:
        for line in p.read_text().splitlines():
            match = _NAME.match(line)
            le = _LE.search(line)
            if match and le and match.group().endswith("_bucket") and le[1] != "+Inf":
                out.setdefault(match.group().removesuffix("_bucket"), set()).add(float(le[1]))
    return out


class _Replay(BaseHTTPRequestHandler):
    server: _ReplayServer

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.server.scrapes += 1
        body = scaled(self.server.text, self.server.scrapes).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _ReplayServer(ThreadingHTTPServer):
    def __init__(self, text: str) -> None:
        super().__init__(("127.0.0.1", 0), _Replay)
        self.text = text
        self.scrapes = 0


@dataclass
class EngineCase:
    """One engine: its files, the model of its spec, the rules and dashboards generated for it."""

    key: str
    files: list[Path]
    model: Model
    dashboards: tuple[Dashboard, ...]
    names: set[str] = field(default_factory=set)

    @property
    def profile(self) -> EngineProfile:
        return ENGINES[self.key]

    def present(self, expr: str) -> tuple[bool, set[str]]:
        """Whether the files hold every engine series ``expr`` reads, and the ones they lack."""
        series, _ = promql_names(expr)
        raw = {s for s in series if not s.startswith("llmslo:") and s not in ("up", "ALERTS")}
        missing = raw - self.names
        return not missing, missing


def _case(key: str, files: list[Path]) -> EngineCase:
    model_name = "facebook/opt-125m" if key == "vllm" else None  # the vLLM file's model
    spec = engine_spec(key, job=JOB, service=key, model=model_name, present_les=bounds(files))
    model = build_model(parse_spec(spec, engine=True), key)
    return EngineCase(key, files, model, build_dashboards(model), sample_names(files))


@dataclass
class Live:
    prometheus: Prometheus
    cases: list[EngineCase]
    targets: int
    started: float = field(default_factory=time.monotonic)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    folder = _real()
    require_tool("prometheus", "Debian package `prometheus`")
    cases = [_case(key, files) for key, files in engine_files(folder).items()]
    tmp = tmp_path_factory.mktemp("engines-prometheus")
    rule_files = []
    for case in cases:
        path = tmp / f"{case.key}-rules.yml"
        path.write_text(render(case.model, path.name, with_tests=False).rules)
        rule_files.append(path)
    servers = [_ReplayServer(p.read_text()) for case in cases for p in case.files]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    targets = [f"127.0.0.1:{s.server_address[1]}" for s in servers]
    try:
        with running_prometheus(tmp / "prometheus", targets, job=JOB, rule_files=rule_files) as prometheus:
            yield Live(prometheus, cases, len(targets))
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


SETTLE_S = 12.0
"""Seconds of scrapes and evaluations before the checks: the 5 s and 20 s windows hold several samples."""


def _settled(live: Live) -> list[dict[str, Any]]:
    """The rules once every target is up, every rule has been evaluated and the windows hold a few samples."""
    deadline = live.started + WAIT_S
    rules: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rules = [r for g in live.prometheus.get("/api/v1/rules")["groups"] for r in g["rules"]]
        up = live.prometheus.query(f'count(up{{job="{JOB}"}} == 1)')
        if (rules and all(r.get("health") != "unknown" for r in rules) and up
                and int(float(up[0]["value"][1])) == live.targets and time.monotonic() - live.started > SETTLE_S):
            return rules
        time.sleep(1.0)
    return rules


def test_the_sources_name_each_files_engine_and_no_trtllm_serve_exposition_exists() -> None:
    folder = _real()
    sources = (folder / "SOURCES.md").read_text()
    files = engine_files(folder)
    assert set(files) == {"vllm", "sglang", "tgi", "llamacpp"}
    for key, paths in files.items():
        for path in paths:
            (row,) = [line for line in sources.splitlines() if line.startswith(f"| `{path.name}`")]
            assert NAMED_IN_SOURCES[key] in row, (path.name, row)
    assert not any("trtllm" in p.name or "tensorrt" in p.name.lower() for p in folder.iterdir())
    assert "trtllm" not in sources.lower() and "tensorrt" not in sources.lower()  # promtool alone proves it


def test_the_replayed_exposition_grows_counters_and_keeps_gauges() -> None:
    text = ("# TYPE a counter\na_total 2\n# TYPE g gauge\ng 3\n# TYPE h histogram\n"
            'h_bucket{le="1.0"} 1\nh_bucket{le="+Inf"} 2\nh_sum 0.5\nh_count 2\n'
            '# TYPE s summary\ns{quantile="0.5"} 7\ns_sum 4\ns_count 2\n')
    assert scaled(text, 3) == ("# TYPE a counter\na_total 6.0\n# TYPE g gauge\ng 3\n# TYPE h histogram\n"
                               'h_bucket{le="1.0"} 3.0\nh_bucket{le="+Inf"} 6.0\nh_sum 1.5\nh_count 6.0\n'
                               '# TYPE s summary\ns{quantile="0.5"} 7\ns_sum 12.0\ns_count 6.0\n')


def test_every_engine_rule_is_evaluated_by_prometheus_without_error(live: Live) -> None:
    rules = _settled(live)
    expected = sum(len(g.rules) for case in live.cases for g in generate_groups(case.model))
    assert len(rules) == expected
    bad = [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok" or r.get("lastError")]
    assert not bad, bad


def test_every_recording_rule_yields_a_series_where_the_file_holds_its_inputs(live: Live) -> None:
    _settled(live)
    with_data: dict[str, list[str]] = {}
    lacking: dict[str, dict[str, set[str]]] = {}
    for case in live.cases:
        for slo, group in zip(case.model.slos, generate_groups(case.model), strict=False):
            holds, missing = case.present(group.rules[0].expr)
            if not holds:
                assert all(case.profile.by_name(n) is not None for n in missing), missing
                assert not missing & case.names
                lacking.setdefault(case.key, {})[slo.name] = missing
                continue
            for rule in group.rules:
                if rule.record is None:
                    continue
                labels = ",".join(f'{k}="{v}"' for k, v in rule.labels)
                found = live.prometheus.query(f"{rule.record}{{{labels}}}")
                assert found, (case.key, slo.name, rule.record)
            with_data.setdefault(case.key, []).append(slo.name)
    assert set(with_data) == {"vllm", "sglang", "tgi", "llamacpp"}, (with_data, lacking)
    assert len(with_data["vllm"]) == len(live.cases[[c.key for c in live.cases].index("vllm")].model.slos), lacking
    # the TGI file is the first 13 families of a scrape: its duration histograms were cut off
    assert {k: set(v) for k, v in lacking.items()} == {"tgi": {"tpot", "e2e", "queue"}}


def test_every_alert_expression_runs(live: Live) -> None:
    _settled(live)
    for case in live.cases:
        for group in generate_groups(case.model):
            for rule in group.rules:
                if rule.alert is not None:
                    live.prometheus.query(rule.expr)  # PrometheusError on a PromQL error


def _substitute(expr: str) -> str:
    for variable, value in (("$__rate_interval", RATE_INTERVAL), ("$job", JOB), ("$model", ".*")):
        expr = expr.replace(variable, value)
    return expr


def test_every_dashboard_query_runs_and_answers_where_the_file_holds_its_series(live: Live) -> None:
    _settled(live)
    answered = 0
    for case in live.cases:
        slo_names = {s.name for s in case.model.slos}
        with_inputs = {slo.name for slo, g in zip(case.model.slos, generate_groups(case.model), strict=False)
                       if case.present(g.rules[0].expr)[0]}
        for dashboard in case.dashboards:
            for query in panel_queries(dashboard.data):
                expr = _substitute(query.expr)
                try:
                    result = live.prometheus.query(expr)
                except PrometheusError as exc:
                    raise AssertionError(f"{dashboard.file_name} / {query.panel}: {expr}: {exc}") from None
                holds, missing = case.present(expr)
                assert all(case.profile.by_name(n) is not None for n in missing), (query.panel, missing)
                named = set(re.findall(r'llmslo_slo="([^"]+)"', expr)) & slo_names
                if "ALERTS" in expr or not holds or (named and not named <= with_inputs) or (
                        "llmslo:" in expr and not with_inputs):
                    continue
                assert result, f"{dashboard.file_name} / {query.panel}: no data for {expr}"
                answered += 1
            for variable in variable_queries(dashboard.data):
                match = LABEL_VALUES.match(_substitute(variable.query))
                assert match is not None
                listed = live.prometheus.query(f"count by ({match['label']}) ({match['series']})")
                assert listed, (dashboard.file_name, variable.name, variable.query)
    assert answered >= 150
