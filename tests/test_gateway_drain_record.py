"""The gateway's own drain record, its breakers in the pool's changes, and the drain's max-inflight rule.

- ``llmslo gateway --drain-record FILE.json`` as a person runs it (the installed command, from a plain folder, a
  relative path): SIGTERM drains it (readiness false first, its stream closed ``max_inflight``), it says where the
  record went, exits 0, and ``llmslo rollout record`` stores the record;
- a backend's breaker opening, and half-opening back into routing, is one log line and one count each (as a health
  change), never one per request;
- the max-inflight rule through each door: ``--drain-max-inflight``, a pool file's ``drain:``, the admin API's
  drain body, and a bad value at each named with the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmslo.gateway import GatewayConfig, load_pool
from llmslo.telemetry import ConfigurationError
from llmslo.tests._gateway_support import ScriptedBackend, running

EXE = Path(sys.executable).with_name("llmslo")


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def llmslo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmslo.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.02)


@contextlib.contextmanager
def process(argv: list[str], cwd: Path, log: Path) -> Iterator[subprocess.Popen[str]]:
    """``argv`` run in ``cwd`` (stdout a pipe, stderr to ``log``), stopped by its pid on the way out."""
    with log.open("w") as err:
        p = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        yield p
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        assert p.stdout is not None
        p.stdout.close()


# ---- 1. the gateway's own drain record ---------------------------------------------------------------------


@pytest.mark.integration
def test_sigterm_drains_the_gateway_writes_its_record_and_rollout_record_stores_it(tmp_path: Path) -> None:
    from llmslo.ops._live_processes import ready_match, ready_port
    from llmslo.ops._live_rollout import GATEWAY_READY

    if not EXE.exists():
        pytest.skip(f"no installed llmslo command beside {sys.executable}")
    serve_argv = [str(EXE), "serve", "--port", "0", "--model", "sim", "--drain-settle", "0s"]
    with process(serve_argv, tmp_path, tmp_path / "serve.log") as serve:
        backend = f"http://127.0.0.1:{ready_port(serve)}"
        argv = [str(EXE), "gateway", "--backend", f"a={backend}@v1", "--port", "0", "--admin-port", "0",
                "--version", "gw1", "--drain-settle", "1s", "--drain-idle", "off", "--drain-max-inflight", "1s",
                "--drain-record", "out/drain.json", "--next-version", "gw2", "--update-id", "gw1-to-gw2-test"]
        with process(argv, tmp_path, tmp_path / "gateway.log") as gateway:
            front = f"http://127.0.0.1:{ready_match(gateway, GATEWAY_READY, 'llmslo gateway').group(1)}"
            got: list[bytes] = []
            statuses: list[int] = []
            body = {"model": "sim", "prompt": "hello", "max_tokens": 500, "stream": True}

            def stream() -> None:
                with httpx.stream("POST", f"{front}/v1/completions", json=body, timeout=60) as r:
                    statuses.append(r.status_code)
                    for part in r.iter_raw():
                        got.append(part)

            reader = threading.Thread(target=stream, daemon=True)
            reader.start()
            wait_for(lambda: len(got) >= 2 or not reader.is_alive(), "the stream's first events")
            assert statuses == [200] and reader.is_alive(), (statuses, got)
            gateway.send_signal(signal.SIGTERM)
            wait_for(lambda: httpx.get(f"{front}/ready", timeout=5).status_code == 503, "readiness false", 5)
            ready_false_while_streaming = reader.is_alive()  # the stream is still in flight: readiness went first
            reader.join(timeout=30)
            assert not reader.is_alive()
            assert gateway.wait(timeout=30) == 0
    log = (tmp_path / "gateway.log").read_text()
    assert ready_false_while_streaming
    last = json.loads(b"".join(got).split(b"data: ")[-1].split(b"\n")[0])
    assert last["finish_reason"] == "server_draining" and last["drain_reason"] == "max_inflight", last
    # the message first: where the record went, as given and in full, and how to store it
    where = tmp_path / "out" / "drain.json"
    assert (f"drain record written to out/drain.json ({where}), update gw1-to-gw2-test: llmslo rollout record "
            "out/drain.json --db STORE stores it") in log, log
    assert "exit 0 (drain drained; drain record out/drain.json)" in log, log
    assert [p.name for p in where.parent.iterdir()] == ["drain.json"]  # no temporary file left beside it
    record = json.loads(where.read_text())
    assert record["update_id"] == "gw1-to-gw2-test"
    drain = record["drain"]
    assert (drain["from_version"], drain["to_version"], drain["decision"]) == ("gw1", "gw2", "drained")
    assert drain["closed_by_reason"]["max_inflight"] == 1 and drain["in_flight_at_start"] == 1
    stored = llmslo(tmp_path, "rollout", "record", "out/drain.json", "--db", "store.duckdb")
    assert stored.returncode == 0, stored.stderr
    assert "gw1-to-gw2-test (gw1 → gw2): recorded" in stored.stdout, stored.stdout
    assert "store store.duckdb: 1 update record(s) written" in stored.stdout, stored.stdout


def test_a_drain_record_needs_the_next_version_and_a_file(tmp_path: Path) -> None:
    r = llmslo(tmp_path, "gateway", "--backend", "http://127.0.0.1:1", "--drain-record", "drain.json")
    assert r.returncode == 2 and "--drain-record: needs --next-version" in r.stderr, r.stderr
    r = llmslo(tmp_path, "gateway", "--backend", "http://127.0.0.1:1", "--drain-record", ".", "--next-version", "v2")
    assert r.returncode == 2 and "--drain-record: . is a folder; give a file, e.g. drain.json" in r.stderr, r.stderr
    with pytest.raises(ConfigurationError, match="--drain-record: needs --next-version"):
        GatewayConfig(backends=load_pool(_pool(tmp_path, "")).backends, drain_record=Path("d.json"))


def test_the_gateway_drained_in_process_writes_its_record_whole(tmp_path: Path) -> None:
    async def go() -> None:
        async with running([ScriptedBackend()], drain_record=tmp_path / "sub" / "d.json", next_version="v9") as (gw, _):
            record = await gw.drain_and_stop()
        assert gw.result.drain_record == tmp_path / "sub" / "d.json"
        written = json.loads((tmp_path / "sub" / "d.json").read_text())
        assert written["drain"] == record.to_dict() and written["drain"]["to_version"] == "v9"
        assert written["update_id"] == f"gateway-to-v9-{int(record.started_unix_s)}"

    run(go())


# ---- 2. a breaker's changes are the pool's changes ---------------------------------------------------------


def test_a_breaker_opening_and_half_opening_is_one_log_line_and_one_count_each(
        caplog: pytest.LogCaptureFixture) -> None:
    def changes(metrics: str) -> str:
        (line,) = [x for x in metrics.splitlines() if x.startswith('llmslo_backend_pool_changes_total{backend="a"}')]
        return line.rsplit(" ", 1)[1]

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "llmslo.gateway" and "breaker" in r.getMessage()]

    async def go() -> None:
        a = ScriptedBackend()
        async with running([a], breaker_failures=2, breaker_open_s=0.5) as (gw, _rows), \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.port}", timeout=30) as c:
            failing = {"model": "m", "prompt": "script:status=503", "max_tokens": 1}
            before = changes((await c.get("/metrics")).text)
            codes = [(await c.post("/v1/completions", json=failing)).status_code for _ in range(5)]
            opened, when_open = changes((await c.get("/metrics")).text), lines()
            assert gw.pool.backends["a"].breaker.state == "open" and len(a.seen) == 2
            await asyncio.sleep(0.6)
            status = (await c.get("/ready")).status_code  # reads routability: the breaker half-opens
            half_open, when_half_open = changes((await c.get("/metrics")).text), lines()
            ok = await c.post("/v1/completions", json={"model": "m", "prompt": "script:tokens=1", "max_tokens": 1})
            closed, at_end = changes((await c.get("/metrics")).text), lines()
        assert codes == [503] * 5 and status == 200 and ok.status_code == 200
        assert (before, opened, half_open, closed) == ("0.0", "1.0", "2.0", "2.0")
        assert when_open == ["backend a breaker open: 2 failures in a row; one probe in 0.5 s"], when_open
        assert when_half_open == [*when_open, "backend a breaker half-open after 0.5 s open: routable for one probe"]
        assert at_end == when_half_open  # the probe closed it: routable before and after, no change
        assert gw.pool.backends["a"].changes == 2

    with caplog.at_level(logging.WARNING, logger="llmslo.gateway"):
        run(go())


# ---- 3. the drain's max-inflight rule, through each door ---------------------------------------------------


def _pool(folder: Path, drain: str) -> Path:
    path = folder / "pool.yaml"
    path.write_text("backends:\n  - {id: a, url: 'http://127.0.0.1:1'}\n" + drain)
    return path


def test_the_pool_files_drain_rules_are_read_and_a_bad_one_is_named_with_the_fix(tmp_path: Path) -> None:
    read = load_pool(_pool(tmp_path, "drain:\n  max_inflight_s: 2\n  idle_s: off\n  settle_s: 0\n"))
    assert dict(read.drain) == {"drain_max_inflight_s": 2.0, "drain_idle_s": None, "drain_settle_s": 0.0}
    assert dict(load_pool(_pool(tmp_path, "")).drain) == {}
    for text, message in [
        ("drain:\n  max_inflight_s: -1\n", 'drain: max_inflight_s: must be a number of seconds > 0, or "off" for '
                                           "never, got -1; e.g. max_inflight_s: 300"),
        ("drain:\n  max_inflight_s: 5m\n", "drain: max_inflight_s: must be a number of seconds > 0, or \"off\" for "
                                           "never, got '5m'"),
        ("drain:\n  max_inflight: 5\n", "drain: unknown field(s) max_inflight; known: budget_s, settle_s, idle_s, "
                                        "max_inflight_s, on_budget"),
        ("drain: 5\n", "drain: expected a mapping of drain rules"),
    ]:
        with pytest.raises(ConfigurationError, match=r"pool\.yaml: ") as caught:
            load_pool(_pool(tmp_path, text))
        assert message in str(caught.value), caught.value


def test_the_drain_max_inflight_rule_reaches_the_gateway_from_the_flag_or_the_pool_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import llmslo.cli._gateway as cli
    from llmslo.cli._app import app

    configs: list[GatewayConfig] = []
    monkeypatch.setattr(cli, "_run", lambda config, version, writer: configs.append(config))
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    base = ["gateway", "--port", "0", "--admin-port", "0"]
    assert runner.invoke(app, [*base, "--backend", "http://127.0.0.1:1"]).exit_code == 0
    assert runner.invoke(app, [*base, "--backend", "http://127.0.0.1:1", "--drain-max-inflight", "90s"]).exit_code == 0
    _pool(tmp_path, "drain:\n  max_inflight_s: 45\n  budget_s: 20\n")
    done = runner.invoke(app, [*base, "--pool", "pool.yaml", "--drain-idle", "off"])
    assert done.exit_code == 0, done.output
    assert [c.drain_max_inflight_s for c in configs] == [None, 90.0, 45.0]
    assert (configs[2].drain_budget_s, configs[2].drain_idle_s) == (20.0, None)  # the file's, then the flag's

    bad = llmslo(tmp_path, "gateway", "--backend", "http://127.0.0.1:1", "--drain-max-inflight", "-5s")
    assert bad.returncode == 2, bad.stderr
    assert "--drain-max-inflight: invalid duration '-5s'" in bad.stderr and "'off' switches it off" in bad.stderr
    both = llmslo(tmp_path, "gateway", "--pool", "pool.yaml", "--drain-max-inflight", "1m")
    assert both.returncode == 2, both.stderr
    assert "--drain-max-inflight and the pool file's drain: max_inflight_s: choose one (the file has " \
           "max_inflight_s: 45.0)" in both.stderr
    _pool(tmp_path, "drain:\n  max_inflight_s: 0\n")
    zero = llmslo(tmp_path, "gateway", "--pool", "pool.yaml")
    assert zero.returncode == 2 and "pool.yaml: drain: max_inflight_s: must be a number of seconds > 0" in zero.stderr


def test_the_admin_drain_takes_max_inflight_s_and_names_a_bad_one_with_the_fix() -> None:
    async def go() -> None:
        a = ScriptedBackend()
        async with running([a], drain_idle_s=None) as (gw, _rows), \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.admin_port}", timeout=30) as admin, \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.port}", timeout=30) as c:
            for body, message in [
                ({"max_inflight_s": -1}, 'max_inflight_s: must be a number of seconds > 0, or "off" for never, '
                                         "got -1; e.g. max_inflight_s: 300"),
                ({"max_inflight_s": "5m"}, "max_inflight_s: must be a number of seconds > 0"),
                ({"max_inflight": 5}, "unknown field(s) max_inflight; known: budget_s, settle_s, idle_s, "
                                      "max_inflight_s, on_budget"),
            ]:
                refused = await admin.post("/admin/backends/a/drain", json=body)
                assert refused.status_code == 400, refused.text
                assert f"drain options: {message}" in refused.json()["error"]["message"], refused.text
            assert gw.pool.backends["a"].in_pool  # a refused drain changed nothing

            async def long() -> bytes:
                body = {"model": "m", "prompt": "script:tokens=100,gap=0.05", "max_tokens": 100, "stream": True}
                async with c.stream("POST", "/v1/completions", json=body) as r:
                    return b"".join([part async for part in r.aiter_raw()])

            streaming = asyncio.ensure_future(long())
            while not a.seen:
                await asyncio.sleep(0.01)
            drained = await admin.post("/admin/backends/a/drain?wait=1", json={"max_inflight_s": 0.3, "budget_s": 10})
            raw = await streaming
        assert drained.status_code == 200, drained.text
        record = drained.json()
        assert record["decision"] == "drained" and record["closed_by_reason"]["max_inflight"] == 1
        assert record["actual_drain_s"] < 3  # closed for its age, not left to run its 5 s
        last = json.loads(raw.split(b"data: ")[-1])
        assert last["finish_reason"] == "server_draining" and last["drain_reason"] == "max_inflight"

    run(go())
