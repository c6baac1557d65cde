"""The live system end to end: ``llmslo demo --live`` run as a person runs it, scraped by a real Prometheus.

One run: the installed ``llmslo demo --live --out run`` in a fresh working directory (a relative folder,
as the README has it: a relative path handed on to Prometheus once loaded no rule, so no alert fired),
behind which :func:`llmslo.ops.run_live` runs ``llmslo serve`` under ``llmslo load``: a calm phase, an
overload burst, calm again, one long reply asked for, then SIGTERM to the server while the load still runs
(the long reply outlives the drain budget, so the drain cuts it). Prometheus (Debian's package) scrapes the
server every second with the rules ``llmslo rules generate`` makes from ``examples/live-slo.yaml``. Every
test below reads that one run's files (what the run saw: ``run/run.json``), what Prometheus recorded, and
what the command printed, and checks that the client, the server and Prometheus tell the same story.
Loopback only; every process is stopped by its pid; the run is bounded (about 80 s here).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest

from llmslo.ops import LiveRun
from llmslo.tests._tools import require_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BURN_OR_SATURATION = ("LiveGoodputBudgetBurn20s5s", "LiveTtftBudgetBurn20s5s", "LiveQueueNearCapacity")
"""The alerts the burst must fire (any of them): the fast burn of either objective, or queue saturation."""


@dataclass(frozen=True)
class Demo:
    """What ``llmslo demo --live --out run`` printed, and the run it describes."""

    run: LiveRun
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    require_tool("prometheus", "Debian package `prometheus`")
    exe = Path(sys.executable).parent / "llmslo"
    if not exe.is_file():
        pytest.skip(f"the installed llmslo command is not at {exe}")
    cwd = tmp_path_factory.mktemp("live")
    done = subprocess.run([str(exe), "demo", "--live", "--out", "run"], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    run = LiveRun.from_dict(json.loads((cwd / "run" / "run.json").read_text()), relative_to=cwd)
    assert run.folder == cwd / "run"
    return Demo(run, done.stdout, done.stderr)


@pytest.fixture(scope="module")
def live(demo: Demo) -> LiveRun:
    return demo.run


def _rows(db: Path) -> dict[str, dict[str, Any]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        frame = con.sql("SELECT * FROM request_summaries").fetchall()
        names = [c[0] for c in con.sql("SELECT * FROM request_summaries LIMIT 0").description]
    finally:
        con.close()
    return {r[0]: dict(zip(names, r, strict=True)) for r in frame}


@pytest.fixture(scope="module")
def server(live: LiveRun) -> dict[str, dict[str, Any]]:
    return _rows(live.server_db)


@pytest.fixture(scope="module")
def client(live: LiveRun) -> dict[str, dict[str, Any]]:
    """Every client summary: the load's and the long reply's (two clients, two stores)."""
    return _rows(live.client_db) | _rows(live.long_client_db)


def _attempts(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture(scope="module")
def attempts(live: LiveRun) -> list[dict[str, Any]]:
    """The load's attempts (one client, whose breaker honours the Retry-After it was given)."""
    return _attempts(live.attempts_log)


@pytest.fixture(scope="module")
def long_attempt(live: LiveRun) -> dict[str, Any]:
    (attempt,) = _attempts(live.long_attempts_log)
    return attempt


def test_every_process_ended_cleanly(live: LiveRun) -> None:
    assert live.server_exit_code == 0, (live.folder / "server.log").read_text()[-2000:]
    assert live.load_exit_code == 0, (live.folder / "load.log").read_text()[-2000:]
    assert live.long_stream_exit_code == 0, (live.folder / "long-stream.log").read_text()[-2000:]


def test_nothing_lost_every_sent_attempt_has_one_client_and_one_server_summary(
        live: LiveRun, server: dict[str, dict[str, Any]], client: dict[str, dict[str, Any]],
        attempts: list[dict[str, Any]], long_attempt: dict[str, Any]) -> None:
    ids = [a["request_id"] for a in [*attempts, long_attempt]]
    assert len(ids) == len(set(ids)) == len(client), "one client summary per attempt"
    sent = {a["request_id"] for a in [*attempts, long_attempt] if not a["breaker_refused"]}
    refused = set(ids) - sent
    assert set(server) == sent, (f"server summaries without a sent attempt: {sorted(set(server) - sent)[:5]}; "
                                 f"sent attempts without a server summary: {sorted(sent - set(server))[:5]}")
    assert all(client[i]["finish_reason"] == "rejected" and client[i]["reject_reason"] == "circuit_open"
               and client[i]["client_e2e_s"] is None for i in refused)
    mismatched = [(i, client[i]["finish_reason"], client[i]["reject_reason"],
                   server[i]["finish_reason"], server[i]["reject_reason"])
                  for i in sent if (client[i]["finish_reason"], client[i]["reject_reason"])
                  != (server[i]["finish_reason"], server[i]["reject_reason"])]
    assert not mismatched, f"{len(mismatched)} attempts whose finish reasons disagree, e.g. {mismatched[:5]}"
    reasons = Counter(r["finish_reason"] for r in server.values())
    assert reasons["length"] > 100 and reasons["client_cancel"] > 0 and reasons["rejected"] > 0, reasons


def test_prometheus_counts_equal_the_server_summaries(live: LiveRun, server: dict[str, dict[str, Any]]) -> None:
    assert live.prometheus is not None
    last_terminal = max(r["arrival_unix_s"] + r["e2e_s"] for r in server.values())
    assert live.prometheus.at_unix_s > last_terminal, "Prometheus's last scrape came before the last terminal state"
    assert live.prometheus.requests_by_finish_reason == dict(Counter(r["finish_reason"] for r in server.values()))
    assert live.prometheus.rejected_by_reason == dict(
        Counter(r["reject_reason"] for r in server.values() if r["finish_reason"] == "rejected"))


def test_server_ttft_never_exceeds_the_clients(server: dict[str, dict[str, Any]],
                                               client: dict[str, dict[str, Any]]) -> None:
    both = [(server[i]["ttft_s"], c["client_ttft_s"]) for i, c in client.items()
            if i in server and server[i]["ttft_s"] is not None and c["client_ttft_s"] is not None]
    assert len(both) > 100
    assert all(s <= c for s, c in both), [p for p in both if p[0] > p[1]][:5]


def test_prometheus_ttft_buckets_hold_exactly_the_summaries_and_bracket_their_quantiles(
        live: LiveRun, server: dict[str, dict[str, Any]]) -> None:
    assert live.prometheus is not None
    ttft = sorted(r["ttft_s"] for r in server.values() if r["ttft_s"] is not None)
    buckets = sorted((float(le), n) for le, n in live.prometheus.ttft_buckets.items())
    assert buckets[-1] == (math.inf, len(ttft))
    for le, n in buckets:
        assert n == sum(t <= le for t in ttft), f"bucket le={le}: Prometheus {n}"
    for q in (0.5, 0.9, 0.99):
        exact = ttft[max(0, math.ceil(q * len(ttft)) - 1)]
        rank = q * len(ttft)
        upper = next(le for le, n in buckets if n >= rank)
        lower = max((le for le, n in buckets if n < rank), default=0.0)
        assert lower < exact <= upper, f"p{q * 100:g} {exact} outside ({lower}, {upper}]"


def test_the_burst_fires_an_alert_that_resolves_after_it(live: LiveRun) -> None:
    spans = {a.name: a for a in live.alerts}
    fired = [spans[n] for n in BURN_OR_SATURATION if n in spans and spans[n].firing_unix_s is not None]
    assert fired, f"none of {BURN_OR_SATURATION} fired; seen: {live.alerts}"
    start, end = live.burst_unix_s
    assert live.sigterm_unix_s is not None
    for span in fired:
        assert span.firing_unix_s is not None and start <= span.firing_unix_s <= end + 15, span
    # The burst's backlog ends late and each alert's windows then have to clear: at least one must have
    # resolved while the calm load ran on (before SIGTERM, whose refusals burn the budget again).
    resolved = [s for s in fired if s.resolved_unix_s is not None and s.resolved_unix_s < live.sigterm_unix_s]
    assert resolved, f"none of the fired alerts resolved before SIGTERM: {fired}"


def test_an_exemplar_names_a_request_in_the_bucket_it_marks(live: LiveRun, server: dict[str, dict[str, Any]]) -> None:
    assert live.prometheus is not None and live.prometheus.exemplars
    bounds = sorted(float(le) for le in live.prometheus.ttft_buckets)
    checked = 0
    for e in live.prometheus.exemplars:
        row = server.get(e["request_id"])
        assert row is not None, f"exemplar names {e['request_id']!r}, which has no summary"
        le = float(e["le"])
        lower = max((b for b in bounds if b < le), default=0.0)
        assert lower < row["ttft_s"] <= le and row["ttft_s"] == pytest.approx(e["value"], abs=1e-6), (e, row)
        checked += 1
    assert checked > 0


def test_every_refusal_carried_retry_after_and_the_client_waited_it_out(attempts: list[dict[str, Any]]) -> None:
    refusals = [a for a in attempts if a["status"] in (429, 503)]
    assert refusals, "the burst and the drain must have been refused somewhere"
    assert all(a["retry_after"] is not None for a in refusals if a["status"] == 429)
    sends = sorted(a["sent_ns"] for a in attempts if not a["breaker_refused"] and a["sent_ns"] is not None)
    for a in refusals:
        if a["retry_after"] is None:
            continue
        free_ns = a["headers_ns"] + float(a["retry_after"]) * 1e9
        early = [s for s in sends if a["headers_ns"] < s < free_ns]
        assert not early, f"{len(early)} attempts sent before {a['request_id']}'s Retry-After {a['retry_after']} passed"


def test_the_drain_ended_by_its_rule_and_cut_streams_ended_server_draining(
        live: LiveRun, server: dict[str, dict[str, Any]], client: dict[str, dict[str, Any]],
        long_attempt: dict[str, Any]) -> None:
    drain = json.loads(live.drain_record.read_text())["drain"]
    assert drain["decision"] in ("drained", "terminate", "return_to_pool"), drain
    if drain["decision"] == "drained":
        assert drain["remaining"] == 0
    cut = sum(drain["closed_by_reason"].values())  # idle, max_inflight, and budget_exhausted (the terminated)
    assert cut > 0, f"the drain cut no stream, not even the long reply: {drain}"
    assert drain["terminated"] == drain["closed_by_reason"]["budget_exhausted"]
    long_id = long_attempt["request_id"]
    assert server[long_id]["finish_reason"] == "server_draining", server[long_id]
    assert server[long_id]["generated_tokens"] < live.plan.long_stream_tokens
    drained = {i for i, r in server.items() if r["finish_reason"] == "server_draining"}
    assert len(drained) == cut, (drain, len(drained))
    assert all(client[i]["finish_reason"] == "server_draining" for i in drained)
    assert drain["in_flight_at_start"] >= len(drained)
    after = [r for r in server.values() if r["arrival_unix_s"] >= (live.sigterm_unix_s or 0) + 0.05]
    assert after and all(r["finish_reason"] == "rejected" and r["reject_reason"] == "draining" for r in after)


def _table(text: str, title: str) -> dict[str, list[str]]:
    """The rows of the table titled ``title`` in a command's output, by their first cell."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    rows: dict[str, list[str]] = {}
    for line in lines[start + 1:]:
        if not line.strip() or line[0] not in "┏┃┡│└":
            break
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if line.startswith("│") and cells[0]:
            rows[cells[0]] = cells[1:]
    return rows


def test_the_demo_says_how_many_rules_prometheus_loaded(demo: Demo) -> None:
    from llmslo.ops import rule_file_counts

    said = [line for line in demo.stdout.splitlines() if "rules live-rules.yml loaded" in line]
    assert said, demo.stdout[:3000]
    groups, rules = rule_file_counts([demo.run.folder / "live-rules.yml"])
    assert groups > 0 and rules > 0
    assert f"loaded ({groups} groups, {rules} rules, as Prometheus reports)" in said[0], said


def test_the_alert_table_a_person_sees_shows_the_burst_alert(demo: Demo) -> None:
    """``llmslo demo --live``, run as the README says, printed an empty alert table (issue: relative rule
    file paths loaded no rule): the printed table names an alert of the burst, with when it fired."""
    alerts = _table(demo.stdout, "Alerts (seconds from the first arrival)")
    assert alerts, f"no alert fired; the demo printed:\n{demo.stdout[:4000]}"
    fired = [name for name in alerts if name in BURN_OR_SATURATION]
    assert fired, alerts
    assert all(alerts[name][1] != "-" for name in fired), alerts


def test_the_printed_run_shows_each_finish_reason_as_the_three_views_counted_it(
        demo: Demo, server: dict[str, dict[str, Any]], client: dict[str, dict[str, Any]]) -> None:
    live, text = demo.run, demo.stdout
    prom = live.prometheus.requests_by_finish_reason if live.prometheus is not None else {}
    by_server, by_client = Counter(r["finish_reason"] for r in server.values()), \
        Counter(r["finish_reason"] for r in client.values())
    rows = _table(text, "The same requests, three views")
    for reason in set(by_server) | set(by_client):
        assert rows[reason] == [f"{by_client[reason]:,}", f"{by_server[reason]:,}",
                                f"{prom[reason]:,}" if reason in prom else "-"], (reason, text)
    refused = sum(r["finish_reason"] == "rejected" and r["reject_reason"] == "circuit_open" for r in client.values())
    assert f"client rejected includes {refused} arrival(s)" in text
