"""``llmslo rollout run`` when the gateway's admin API fails during a drain: the backend taken out of the pool is put
back (or the message names it and the command that does), the failure is in its update record, and the command
exits 1 with the message. The gateway is a scripted admin API on 127.0.0.1 that fails at a chosen call; the new
version is a real process (``python -m http.server`` serving a ``health`` file)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llmslo.analysis.rollout import validate_update
from llmslo.cli._app import app
from llmslo.ops import RolloutResult, RolloutRunner, plan_from_dict, stop_process

pytestmark = pytest.mark.slow  # the runner starts each new version as a process (python -m http.server)

OLD = "v1-a"
DRAINED = {"wait_budget_s": 1.0, "unregister_settle_s": 0.0, "actual_drain_s": 0.02, "in_flight_at_start": 0,
           "closed_by_reason": {}, "ended_by_reason": {}, "terminated": 0, "timed_out": 0, "requeued": 0,
           "requeue_failed": 0, "remaining": 0, "decision": "drained"}


class FakeAdmin:
    """A gateway's admin API holding a pool of backends; ``fail`` maps ``"METHOD PATH"`` to the status that call
    answers instead (the drain call takes the backend out of the pool first, as the gateway's does)."""

    def __init__(self, fail: dict[str, int]) -> None:
        self.fail = fail
        self.calls: list[str] = []
        self.backends: dict[str, dict[str, Any]] = {
            OLD: {"id": OLD, "url": "http://127.0.0.1:9", "version": "v1", "slots": 1, "in_pool": True,
                  "removed_unix_s": None, "last_routed_unix_s": None}}

    def answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        call = f"{method} {path.split('?')[0]}"
        self.calls.append(call)
        parts = path.split("?")[0].strip("/").split("/")
        backend = self.backends.get(parts[2]) if len(parts) > 2 else None
        if call.endswith("/drain") and backend is not None and call not in self.fail:
            backend.update(in_pool=False, removed_unix_s=time.time())
            return 200, DRAINED
        if call.endswith("/drain") and backend is not None and self.fail[call] >= 500:
            backend.update(in_pool=False, removed_unix_s=time.time())  # out of the pool, then the call fails
        if call in self.fail:
            return self.fail[call], {"error": {"message": "scripted failure"}}
        if call == "GET /admin/backends":
            return 200, list(self.backends.values())
        if call == "POST /admin/backends":
            self.backends[body["id"]] = {**body, "in_pool": True, "removed_unix_s": None, "last_routed_unix_s": None}
            return 201, self.backends[body["id"]]
        if backend is None:
            return 404, {"error": {"message": "no such backend"}}
        if method == "GET":
            return 200, backend
        if method == "DELETE":
            return 200, self.backends.pop(backend["id"])
        if call.endswith("/ready"):
            backend["in_pool"] = True
            return 200, backend
        return 404, {"error": {"message": f"no route {call}"}}


def _serve(admin: FakeAdmin) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            size = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(size) if size else b""
            status, body = admin.answer(self.command, self.path, json.loads(raw) if raw.strip() else None)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _reply

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def gateway(request: pytest.FixtureRequest) -> Iterator[tuple[FakeAdmin, str]]:
    admin = FakeAdmin(getattr(request, "param", {}))
    server = _serve(admin)
    try:
        yield admin, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _plan(tmp_path: Path, admin_url: str) -> dict[str, Any]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "health").write_text("ok")
    command = [sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", str(site)]
    return {"gateway": admin_url, "batch_size": 1, "logs": str(tmp_path / "logs"), "start_timeout_s": 30,
            "from": {"version": "v1", "command": command}, "to": {"version": "v2", "command": command},
            "drain": {"caller_timeout_s": 30, "wait_budget_s": 1, "unregister_settle_s": 0,
                      "max_overlap_window_s": 60}}


def _run(tmp_path: Path, admin_url: str) -> tuple[RolloutResult, RolloutRunner, list[str]]:
    said: list[str] = []
    runner = RolloutRunner(plan_from_dict(_plan(tmp_path, admin_url)), said.append)
    try:
        return runner.run(update_id="u1"), runner, said
    finally:
        for process in runner.started:
            stop_process(process, 5.0)


@pytest.mark.parametrize("gateway", [{"GET /admin/backends/v1-a": 500}, {"DELETE /admin/backends/v1-a": 500}],
                         indirect=True, ids=["status read", "removal"])
def test_a_failure_after_the_drain_puts_the_backend_back_and_is_recorded(
        tmp_path: Path, gateway: tuple[FakeAdmin, str]) -> None:
    admin, url = gateway
    result, runner, said = _run(tmp_path, url)
    assert admin.backends[OLD]["in_pool"] is True  # put back
    assert admin.calls[-1] == f"POST /admin/backends/{OLD}/ready"
    new = result.batches[0].new
    assert [b for b in admin.backends if b != OLD] == new and all(admin.backends[b]["in_pool"] for b in new)
    assert result.outcome == "failed" and result.batches[0].outcome == "failed"
    assert result.batches[0].overlap_to_unix_s is None  # both versions serve: the overlap has not closed
    assert result.failure is not None and "answered 500" in result.failure
    assert f"{OLD} was put back in the pool" in result.failure and said[-1] == result.failure
    (record,) = result.records(runner.plan)
    assert record["extra"]["put_back"] is True and "answered 500" in record["extra"]["failure"]
    assert "failed: " in record["notes"] and record["drain"]["decision"] == "drained"  # the gateway's record
    validate_update(record)  # storable as it is


@pytest.mark.parametrize("gateway", [{"POST /admin/backends/v1-a/drain": 502,
                                      "POST /admin/backends/v1-a/ready": 503}], indirect=True)
def test_a_backend_that_cannot_be_put_back_is_named_with_the_command_that_does(
        tmp_path: Path, gateway: tuple[FakeAdmin, str]) -> None:
    admin, url = gateway
    result, runner, _ = _run(tmp_path, url)
    assert admin.backends[OLD]["in_pool"] is False
    assert result.outcome == "failed" and result.failure is not None
    assert f"{OLD} could not be put back in the pool" in result.failure
    assert f"it is out of the pool with its process running; put it back with: llmslo gateway ready {OLD} " \
           f"--admin {url}" in result.failure
    (record,) = result.records(runner.plan)
    assert record["extra"]["put_back"] is False
    assert record["drain"]["wait_budget_s"] == 1.0 and record["drain"]["actual_drain_s"] >= 0.0
    validate_update(record)


@pytest.mark.parametrize("gateway", [{"POST /admin/backends/v1-a/drain": 409}], indirect=True)
def test_a_drain_the_gateway_refuses_takes_nothing_out_so_nothing_is_put_back(
        tmp_path: Path, gateway: tuple[FakeAdmin, str]) -> None:
    admin, url = gateway
    result, _, _ = _run(tmp_path, url)
    assert f"POST /admin/backends/{OLD}/ready" not in admin.calls
    assert admin.backends[OLD]["in_pool"] is True
    assert result.outcome == "failed" and result.failure is not None
    assert "nothing was taken out of the pool" in result.failure


def test_without_a_failure_the_stub_runs_the_update_to_its_end(tmp_path: Path,
                                                              gateway: tuple[FakeAdmin, str]) -> None:
    admin, url = gateway
    result, _, _ = _run(tmp_path, url)
    assert result.outcome == "done" and result.failure is None
    assert OLD not in admin.backends and f"POST /admin/backends/{OLD}/ready" not in admin.calls


@pytest.mark.parametrize("gateway", [{"GET /admin/backends/v1-a": 500}], indirect=True)
def test_the_command_exits_1_with_the_message_and_the_backend_back_in_the_pool(
        tmp_path: Path, gateway: tuple[FakeAdmin, str], monkeypatch: pytest.MonkeyPatch) -> None:
    admin, url = gateway
    (tmp_path / "plan.json").write_text(json.dumps(_plan(tmp_path, url)))
    started: list[RolloutRunner] = []

    class Kept(RolloutRunner):  # kept, to stop the new backend it starts
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr("llmslo.ops.RolloutRunner", Kept)
    try:
        done = CliRunner().invoke(app, ["rollout", "run", "--plan", str(tmp_path / "plan.json")])
    finally:
        for process in (p for r in started for p in r.started):
            stop_process(process, 5.0)
    assert done.exit_code == 1, done.output
    assert "error:" in done.output and f"{OLD} was put back in the pool" in done.output
    assert admin.backends[OLD]["in_pool"] is True
