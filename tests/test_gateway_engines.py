"""The gateway's proof on real components: two llama.cpp ``llama-server`` engines (SmolLM2-135M) and one
``llmslo serve`` behind ``llmslo gateway``, Prometheus scraping every process, ``llmslo load`` bringing a burst
above the pool's capacity; during it one llama-server is killed (SIGKILL) and the other drained through the
admin API (``llmslo gateway drain``). Then:

1. nothing is lost: the client's and the gateway's summaries match one to one, and every refusal was a 429 or
   503 whose ``Retry-After`` the client honoured (it sent nothing in that window);
2. the killed backend's streams end with an error event, its breaker opens, and no request reaches it after the
   kill;
3. the drained backend, streaming when drained, gets no request after its removal, and its streams finished or
   got ``server_draining``;
4. token budgets: of 20 parallel requests against a budget worth 5, 5 are admitted, and the settled totals are
   the engine's own counter deltas;
5. Prometheus's counts equal the gateway's summaries.

Besides: the gateway's TTFT of each stream is within the client's, and its summaries keep the chunk times.

And the way out the engine rules name for what an engine cannot give: rules generated from an SLO spec without
``--engine`` (``llmslo rules generate``) read the gateway's own series. Loaded into the same Prometheus, every rule
evaluates without error, and the TTFT and goodput objectives get values from requests the gateway observed in
front of the llama-servers.

Every process is an installed front door (``python -m llmslo.cli ...``), started from a plain working folder with
relative paths, and stopped by its pid. The engine is built by ``.ci/build-llama-server``.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from llmslo.ops import LlamaServer, running_llama_server, running_prometheus, stop_process
from llmslo.ops._live_processes import GATEWAY_READY
from llmslo.tests._tools import require_tool
from llmslo.tests.test_live_llamacpp import require_engine

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPEC = """\
version: llmslo/v1
service: proof
selector:
  model: smollm2
scrape:
  job: proof
  interval: 1s
evaluation_interval: 1s
objectives:
  - {name: ttft, kind: latency, metric: ttft, threshold: 2s, objective: 99}
  - {name: goodput, kind: goodput, objective: 99}
"""
"""The SLO spec whose rules (generated without ``--engine``) read llmslo's series: the gateway's and the simulated
engine's (both serve ``smollm2`` in the job ``proof``)."""
SERVE_READY = re.compile(r"^serving \S+ on http://127\.0\.0\.1:(\d+)$")
MODEL = "smollm2"
KILL_AT_S = 5.0
DRAIN_AT_S = 8.0


class Proc:
    """``python -m llmslo.cli ARGS`` in ``cwd``; its first line matching ``ready`` gives its ports."""

    def __init__(self, args: list[str], cwd: Path, ready: re.Pattern[str], timeout_s: float = 60.0) -> None:
        self.lines: list[str] = []
        self.err: list[str] = []
        self.process = subprocess.Popen([sys.executable, "-m", "llmslo.cli", *args], cwd=cwd, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.match: re.Match[str] | None = None
        seen = threading.Event()

        def read(stream: Any, into: list[str], watch: bool) -> None:
            for line in stream:
                into.append(line)
                if watch and self.match is None and (m := ready.match(line.strip())):
                    self.match = m
                    seen.set()
            seen.set()

        self._threads = [threading.Thread(target=read, args=(self.process.stdout, self.lines, True), daemon=True),
                         threading.Thread(target=read, args=(self.process.stderr, self.err, False), daemon=True)]
        for t in self._threads:
            t.start()
        if not seen.wait(timeout_s) or self.match is None:
            self.stop()
            raise AssertionError(f"{args[0]} did not get ready:\n" + "".join(self.lines + self.err))

    def port(self, group: int = 1) -> int:
        assert self.match is not None
        return int(self.match.group(group))

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then wait for the exit (its drain); the exit status."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout_s)
        self._close()
        return code

    def stop(self) -> None:
        stop_process(self.process)
        self._close()

    def _close(self) -> None:
        for t in self._threads:
            t.join(5)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None,
          timeout: float = 60.0) -> tuple[int, dict[str, str], dict[str, Any]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, json.loads(exc.read())


def _engine_tokens(server: LlamaServer) -> int:
    """prompt (cached included) + predicted tokens the engine counted so far."""
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total",
                 "llamacpp:tokens_predicted_total"):
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        total += float(m.group(1)) if m else 0.0
    return int(total)


def _backend(admin: int, backend: str) -> dict[str, Any]:
    """The admin API's state of ``backend``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/admin/backends/{backend}", timeout=5) as r:
        state: dict[str, Any] = json.loads(r.read())
    return state


def _wait_streaming(admin: int, backend: str, timeout_s: float) -> int:
    """Wait (at most ``timeout_s``) until ``backend`` streams a reply (its first token reached the gateway), by
    the admin API; how many it streams. A request still waiting for its first token when its engine dies has sent
    its client nothing: the gateway retries it on another backend, which is right, but shows no error event."""
    deadline = time.monotonic() + timeout_s
    while True:
        streaming = int(_backend(admin, backend)["streaming"])
        if streaming or time.monotonic() > deadline:
            return streaming
        time.sleep(0.01)


def _rows(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in f.read_text().splitlines()]


@dataclass
class Proof:
    """What the run left: rows, attempts, times (Unix seconds), Prometheus's answers, the budget phase."""

    client: list[dict[str, Any]] = field(default_factory=list)
    gateway: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    killed_at: float = 0.0
    a_streaming_at_kill: int = 0
    a_at_drain: dict[str, Any] = field(default_factory=dict)
    """The killed backend's state (admin API) when the other one is drained, 3 s after the kill."""
    b_streaming_at_drain: int = 0
    drained_at: float = 0.0
    drain_answer: str = ""
    prometheus: dict[str, float] = field(default_factory=dict)
    rule_health: list[tuple[str, str, str]] = field(default_factory=list)
    """(rule, health, last error) of every rule generated without ``--engine``, as Prometheus evaluated it."""
    slo_errors: dict[str, float] = field(default_factory=dict)
    """SLO name -> ``llmslo:slo_error:ratio_rate5m`` at the end of the run."""
    gateway_ttft_counts: dict[str, float] = field(default_factory=dict)
    """version -> the gateway's ``llmslo_ttft_seconds_count`` at the end of the run."""
    budget_replies: list[tuple[int, dict[str, str], dict[str, Any]]] = field(default_factory=list)
    budget_rows: list[dict[str, Any]] = field(default_factory=list)
    budget_engine_tokens: int = 0
    load_out: str = ""
    gateway_err: str = ""
    gateway_exit: int | None = None


def _budget_phase(work: Path, engine: LlamaServer, proof: Proof) -> None:
    """A gateway in front of ``engine`` with a token budget worth 5 requests; 20 requests at once."""
    pool = work / "budget-pool.yaml"
    pool.write_text(f"backends:\n  - id: solo\n    url: {engine.url}\n    version: llama-solo\n    slots: 2\n")
    # each request reserves its 8 prompt token ids + max_tokens 16 = 24 tokens; the burst holds 5 of them
    gw = Proc(["gateway", "--pool", "budget-pool.yaml", "--port", "0", "--admin-port", "0", "--jsonl", "budget-rows",
               "--tokens-per-min", "0.06", "--token-burst", "120", "--concurrency", "20", "--max-queue", "20"],
              work, GATEWAY_READY)
    try:
        before = _engine_tokens(engine)
        body = {"model": MODEL, "prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 16, "temperature": 0}
        replies: list[tuple[int, dict[str, str], dict[str, Any]]] = []
        lock = threading.Lock()

        def one() -> None:
            reply = _post(f"http://127.0.0.1:{gw.port()}/v1/completions", body,
                          {"authorization": "Bearer budget-key"})
            with lock:
                replies.append(reply)

        threads = [threading.Thread(target=one) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        time.sleep(0.5)
        proof.budget_engine_tokens = _engine_tokens(engine) - before
        proof.budget_replies = replies
    finally:
        gw.terminate()
    proof.budget_rows = _rows(work / "budget-rows")


@pytest.fixture(scope="module")
def proof(tmp_path_factory: pytest.TempPathFactory) -> Proof:
    require_engine()
    require_tool("prometheus", "Debian package `prometheus`")
    work = tmp_path_factory.mktemp("gateway-proof")
    out = Proof()
    with running_llama_server(work / "a", parallel=2, context_tokens=2048, threads=1, alias=MODEL) as a, \
            running_llama_server(work / "b", parallel=2, context_tokens=2048, threads=1, alias=MODEL) as b:
        _budget_phase(work, b, out)
        # the simulated engine at --speed 2 serves about 8 of these requests a second: with the two llama-servers
        # (one killed at 5 s) the pool stays below the burst's 20 a second, so the queue fills and refuses. At
        # --speed 5 it served about 20 a second alone, and a quiet machine could serve the whole burst.
        sim = Proc(["serve", "--port", "0", "--model", MODEL, "--version", "sim-1", "--speed", "2",
                    "--max-num-seqs", "4"], work, SERVE_READY)
        gw: Proc | None = None
        try:
            (work / "pool.yaml").write_text(
                "backends:\n"
                f"  - {{id: a, url: '{a.url}', version: llama-a, slots: 2}}\n"
                f"  - {{id: b, url: '{b.url}', version: llama-b, slots: 2}}\n"
                f"  - {{id: c, url: 'http://127.0.0.1:{sim.port()}', version: sim-1, slots: 4}}\n")
            gw = Proc(["gateway", "--pool", "pool.yaml", "--port", "0", "--admin-port", "0", "--jsonl", "rows",
                       "--concurrency", "8", "--max-queue", "8", "--queue-timeout", "4s", "--breaker-failures", "2",
                       "--breaker-open", "60s", "--drain-settle", "0.5s", "--drain-budget", "6s", "--drain-idle", "3s"],
                      work, GATEWAY_READY)
            port, admin = gw.port(1), gw.port(2)
            targets = [f"127.0.0.1:{port}", a.target, b.target, f"127.0.0.1:{sim.port()}"]
            (work / "proof-slo.yaml").write_text(SPEC)
            subprocess.run([sys.executable, "-m", "llmslo.cli", "rules", "generate", "proof-slo.yaml", "-o",
                            "proof-rules.yml"], cwd=work, check=True, capture_output=True, timeout=60)
            with running_prometheus(work / "prometheus", targets, job="proof",
                                    rule_files=[work / "proof-rules.yml"]) as prom:
                time.sleep(1.5)
                load = subprocess.Popen(
                    [sys.executable, "-m", "llmslo.cli", "load", f"http://127.0.0.1:{port}", "--model", MODEL,
                     "--endpoint", "chat", "--rate", "5", "--duration", "16s", "--burst", "4x@4s+5s",
                     "--prompt-tokens", "16", "--output-tokens", "24", "--seed", "3", "--timeout", "60s",
                     "--jsonl", "client", "--attempts-log", "attempts.jsonl", "--json", "--no-progress"],
                    cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                started = time.time()
                time.sleep(KILL_AT_S)
                out.a_streaming_at_kill = _wait_streaming(admin, "a", timeout_s=15.0)
                a.process.kill()  # SIGKILL: the engine dies with its streams open
                out.killed_at = time.time()
                time.sleep(max(0.0, started + DRAIN_AT_S - time.time()))
                out.a_at_drain = _backend(admin, "a")
                out.b_streaming_at_drain = _wait_streaming(admin, "b", timeout_s=15.0)
                out.drained_at = time.time()
                drain = subprocess.run([sys.executable, "-m", "llmslo.cli", "gateway", "drain", "b", "--admin",
                                        f"http://127.0.0.1:{admin}", "--no-wait"],
                                       cwd=work, capture_output=True, text=True, timeout=30)
                out.drain_answer = drain.stdout + drain.stderr
                out.load_out = load.communicate(timeout=180)[0]
                time.sleep(3.0)  # two more scrapes after the last request
                query = f'sum by (finish_reason) (llmslo_requests_total{{instance="127.0.0.1:{port}"}})'
                for sample in prom.query(query):
                    out.prometheus[sample["metric"].get("finish_reason", "")] = float(sample["value"][1])
                out.rule_health = [(str(r.get("name")), str(r.get("health")), str(r.get("lastError") or ""))
                                   for g in prom.get("/api/v1/rules")["groups"] for r in g.get("rules", [])]
                for sample in prom.query("llmslo:slo_error:ratio_rate5m"):
                    out.slo_errors[sample["metric"].get("llmslo_slo", "")] = float(sample["value"][1])
                for sample in prom.query(f'llmslo_ttft_seconds_count{{instance="127.0.0.1:{port}"}}'):
                    version = sample["metric"].get("version", "")
                    out.gateway_ttft_counts[version] = out.gateway_ttft_counts.get(version, 0.0) + float(
                        sample["value"][1])
            out.gateway_exit = gw.terminate()
            out.gateway_err = "".join(gw.err)
        finally:
            if gw is not None:
                gw.stop()
            sim.stop()
    out.client = _rows(work / "client")
    out.gateway = _rows(work / "rows")
    out.attempts = [json.loads(line) for line in (work / "attempts.jsonl").read_text().splitlines()]
    return out


def test_the_run_saw_a_burst_a_kill_and_a_drain(proof: Proof) -> None:
    by_version = Counter((r["version"], r["finish_reason"]) for r in proof.gateway)
    print(f"gateway summaries {len(proof.gateway)}, client attempts {len(proof.attempts)} "
          f"({sum(a['breaker_refused'] for a in proof.attempts)} held back by the client's breaker); "
          f"by version and finish: {dict(sorted(by_version.items()))}; Prometheus: {proof.prometheus}; "
          f"budget: {sorted(r[0] for r in proof.budget_replies)}, engine tokens {proof.budget_engine_tokens}")
    assert proof.gateway_exit == 0, proof.gateway_err
    assert "draining b" in proof.drain_answer, proof.drain_answer
    # the load offers 160 requests; once the burst brings a refusal, the client's breaker holds back what its
    # Retry-After asks (61 to 113 of them in runs here), so the gateway sees 50 to 100
    assert len(proof.attempts) >= 60 and len(proof.gateway) >= 30, proof.load_out[-2000:]
    reasons = Counter(r["finish_reason"] for r in proof.gateway)
    assert reasons["length"] + reasons["stop"] >= 30 and reasons["rejected"] >= 1, reasons


def test_client_and_gateway_summaries_match_one_to_one(proof: Proof) -> None:
    sent = {a["request_id"] for a in proof.attempts if a["sent_ns"] is not None and not a["breaker_refused"]}
    gateway = {r["request_id"]: r for r in proof.gateway}
    assert set(gateway) == sent
    client = {r["request_id"]: r for r in proof.client}
    for rid in sent:
        c, g = client[rid], gateway[rid]
        if g["finish_reason"] == "rejected":
            assert (c["finish_reason"], c["reject_reason"]) == ("rejected", g["reject_reason"]), (c, g)
        elif g["finish_reason"] in ("length", "stop"):
            assert c["finish_reason"] == g["finish_reason"] and c["generated_tokens"] == g["generated_tokens"]
            # the gateway passes the first token on before the client reads it, and reads the request after the
            # client sent it: its TTFT is within the client's (both on the machine's monotonic clock)
            assert g["ttft_s"] <= c["ttft_s"], (c, g)


def test_the_gateways_summaries_keep_the_chunk_times(proof: Proof) -> None:
    done = [r for r in proof.gateway if r["finish_reason"] in ("length", "stop") and r["generated_tokens"] >= 2]
    assert done
    for r in done:
        gaps = r["itl_s"]
        assert gaps and all(g >= 0 for g in gaps) and len(gaps) <= r["generated_tokens"] - 1, r
        if r["version"].startswith("llama"):  # llama-server streams one token a chunk
            assert len(gaps) == r["generated_tokens"] - 1, r
            assert sum(gaps) == pytest.approx(r["last_token_s"] - r["ttft_s"], abs=1e-6), r


def test_every_refusal_carried_a_retry_after_the_client_honoured(proof: Proof) -> None:
    refusals = [a for a in proof.attempts if a["status"] in (429, 503)]
    assert refusals, "the burst brought no refusal"
    assert all(a["retry_after"] is not None and float(a["retry_after"]) >= 1 for a in refusals)
    sends = sorted(a["sent_ns"] for a in proof.attempts if a["sent_ns"] is not None and not a["breaker_refused"])
    for a in refusals:
        start = a["headers_ns"] + 5_000_000
        end = a["headers_ns"] + float(a["retry_after"]) * 1e9 - 5_000_000
        inside = [s for s in sends if start < s < end]
        assert not inside, f"{len(inside)} requests sent within the Retry-After of {a['request_id']}"
    assert any(a["breaker_refused"] for a in proof.attempts), "the client's breaker held back no arrival"


def test_the_killed_backend_ends_its_streams_with_an_error_event_and_gets_no_request_after(proof: Proof) -> None:
    assert proof.a_streaming_at_kill >= 1, "no stream was in flight on the engine when it was killed"
    # its broken streams and the connections refused after count as failures: its breaker opened, and the pool
    # routes nothing to it
    assert proof.a_at_drain["breaker"] == "open" and proof.a_at_drain["routable"] is False, proof.a_at_drain
    on_a = [r for r in proof.gateway if r.get("backend") == "a"]
    assert on_a and all(r["arrival_unix_s"] <= proof.killed_at for r in on_a)
    broken = [r for r in on_a if r["finish_reason"] == "error"]
    assert broken and {r["error_type"] for r in broken} == {"backend_failed"}
    attempts = {a["request_id"]: a for a in proof.attempts}
    for r in broken:
        assert attempts[r["request_id"]]["server_error"] is not None  # the client read the error event


def test_the_drained_backend_gets_no_request_after_its_removal(proof: Proof) -> None:
    assert proof.b_streaming_at_drain >= 1, "no stream was in flight on the engine when it was drained"
    on_b = [r for r in proof.gateway if r.get("backend") == "b"]
    assert on_b
    assert all(r["arrival_unix_s"] <= proof.drained_at + 0.5 for r in on_b)
    late = [r for r in on_b if r["arrival_unix_s"] + r["e2e_s"] > proof.drained_at]
    assert late and {r["finish_reason"] for r in late} <= {"length", "stop", "server_draining"}, late


def test_token_budgets_admit_five_of_twenty_and_settle_to_the_engine_counts(proof: Proof) -> None:
    ok = [r for r in proof.budget_replies if r[0] == 200]
    refused = [r for r in proof.budget_replies if r[0] == 429]
    assert len(proof.budget_replies) == 20 and len(ok) == 5 and len(refused) == 15
    assert all(r[2]["error"]["type"] == "rate_limited" and "retry-after" in r[1] for r in refused)
    usage = sum(r[2]["usage"]["prompt_tokens"] + r[2]["usage"]["completion_tokens"] for r in ok)
    settled = sum(r["prompt_tokens"] + r["generated_tokens"] for r in proof.budget_rows
                  if r["finish_reason"] in ("length", "stop"))
    assert settled == usage == proof.budget_engine_tokens


def test_prometheus_counts_equal_the_gateway_summaries(proof: Proof) -> None:
    rows = Counter(r["finish_reason"] for r in proof.gateway)
    assert {k: int(v) for k, v in proof.prometheus.items() if v} == dict(rows)


def test_rules_without_engine_read_the_gateways_own_series(proof: Proof) -> None:
    assert proof.rule_health and all(h == "ok" and not e for _, h, e in proof.rule_health), [
        r for r in proof.rule_health if r[1] != "ok" or r[2]]
    assert set(proof.slo_errors) == {"ttft", "goodput"}, proof.slo_errors
    assert all(0.0 <= v <= 1.0 for v in proof.slo_errors.values()), proof.slo_errors
    # the gateway's TTFT histogram counts, per version (backend), the streams whose first token it passed on
    first = Counter(r["version"] for r in proof.gateway if r["ttft_s"] is not None)
    assert {k: int(v) for k, v in proof.gateway_ttft_counts.items() if v} == dict(first)
    assert first["llama-a"] + first["llama-b"] >= 1, first
