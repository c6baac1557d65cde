"""``llmslo rollout run`` over a pool of real llama-servers behind ``llmslo gateway``, under load.

Version v1 and v2 are the same model with other flags (v2 takes more slots): the proof is about the update's
path, not the model. Each test starts its engines and its gateway on 127.0.0.1 and stops them by process id.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from llmslo.ops import LlamaServer, locate_engine, pid_alive, running_llama_server, stop_pid
from llmslo.tests.test_gateway_engines import GATEWAY_READY, Proc, _post, _rows
from llmslo.tests.test_live_llamacpp import require_engine

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _plan(folder: Path, admin: int, **drain: object) -> Path:
    binary, model = locate_engine(None, None)

    def command(parallel: int) -> list[str]:
        return [str(binary), "--model", "{model}", "--alias", "smollm2", "--host", "127.0.0.1", "--port", "{port}",
                "--parallel", str(parallel), "--ctx-size", str(1024 * parallel), "--threads", "1", "--no-webui"]

    plan = {"gateway": f"http://127.0.0.1:{admin}", "batch_size": 1, "logs": str(folder / "logs"),
            "from": {"version": "v1", "slots": 2, "model": str(model), "command": command(2)},
            "to": {"version": "v2", "slots": 3, "model": str(model), "command": command(3)},
            "drain": {"caller_timeout_s": 60, "wait_budget_s": 30, "idle_threshold_s": 30, "poll_interval_s": 0.05,
                      "unregister_settle_s": 0.3, "max_overlap_window_s": 120, "terminate_on_budget": True,
                      **drain}}
    path = folder / "plan.json"
    path.write_text(json.dumps(plan))
    return path


@contextmanager
def _pool(folder: Path, n: int) -> Iterator[tuple[list[LlamaServer], Proc]]:
    with ExitStack() as stack:
        servers = [stack.enter_context(running_llama_server(folder / f"v1-{i}", parallel=2, context_tokens=2048,
                                                            threads=1)) for i in range(n)]
        args = ["gateway", "--port", "0", "--admin-port", "0", "--jsonl", str(folder / "summaries"),
                "--drain-settle", "0.3s"]
        for i, s in enumerate(servers):
            args += ["--backend", f"old{i}={s.url}@v1"]
        gateway = Proc(args, folder, GATEWAY_READY)
        stack.callback(gateway.stop)
        yield servers, gateway


def _backends(admin: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/admin/backends", timeout=5) as r:
        return list(json.loads(r.read()))


def _rollout(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmslo.cli", "rollout", "run", *args], cwd=folder,
                          capture_output=True, text=True, timeout=300)


def _stop_started(result: dict[str, Any]) -> None:
    """Stop the backends a run started (they outlive it, by design), by their process ids."""
    for batch in result["update"]["batches"]:
        for pid in batch["new_pids"]:
            stop_pid(pid, 10.0)


def test_an_update_under_load_terminates_nothing_records_and_compares_and_rolls_back(tmp_path: Path) -> None:
    require_engine()
    with _pool(tmp_path, 2) as (servers, gateway):
        front, admin = gateway.port(1), gateway.port(2)
        stop = threading.Event()
        statuses: list[int] = []
        answered: list[int] = []

        def load() -> None:
            i = 0
            while not stop.is_set() and i < 400:
                code, _, _ = _post(f"http://127.0.0.1:{front}/v1/completions",
                                   {"model": "smollm2", "prompt": f"Count {i}", "max_tokens": 96})
                statuses.append(code)
                i += 1

        clients = [threading.Thread(target=load) for _ in range(2)]
        for c in clients:
            c.start()
        try:
            time.sleep(2.0)
            plan = _plan(tmp_path, admin)
            done = _rollout(tmp_path, "--plan", "plan.json", "--db", "store.duckdb", "--summaries", "summaries",
                            "--update-id", "u1", "--min-count", "5", "--json")
            assert done.returncode == 0, done.stderr[-3000:]
            print(done.stderr)  # the steps and the three numbers per batch (pytest -s shows them)
            result = json.loads(done.stdout)
            try:
                update = result["update"]
                assert update["outcome"] == "done" and len(update["batches"]) == 2
                for batch in update["batches"]:
                    (drained,) = batch["drained"]
                    assert drained["terminated"] == 0 and drained["drain"]["decision"] == "drained"
                    assert 0 <= drained["propagation_s"] < 1.0 and drained["actual_drain_s"] < 30
                    assert batch["overlap_s"] is not None and batch["overlap_s"] <= 120
                    assert drained["stopped_pid"] in {s.process.pid for s in servers}
                assert all(not pid_alive(s.process.pid) for s in servers)  # the old engines were stopped
                assert {b["version"] for b in _backends(admin)} == {"v2"} and len(_backends(admin)) == 2
                assert result["records"] == ["u1-b1-old0", "u1-b2-old1"]
                assert result["summaries_ingested"] > 0
                assert result["comparison"]["verdict"] in ("lossless", "regression", "insufficient_data")
                said = " ".join(done.stderr.split())
                assert "batch 1/2: old0 drained in" in said and "removal propagated in" in said
                shown = subprocess.run([sys.executable, "-m", "llmslo.cli", "rollout", "show", "u1-b1-old0",
                                        "--db", "store.duckdb", "--json"], cwd=tmp_path, capture_output=True,
                                       text=True, timeout=60)
                assert shown.returncode == 0, shown.stderr
                assert json.loads(shown.stdout)["extra"]["removal_propagation_s"] == \
                    update["batches"][0]["drained"][0]["propagation_s"]

                back = _rollout(tmp_path, "--plan", plan.name, "--rollback", "--json")
                answered = list(statuses)  # what the clients got through the update and its rollback
                assert back.returncode == 0, back.stderr[-3000:]
                rolled = json.loads(back.stdout)
                try:
                    assert rolled["update"]["rollback"] is True
                    assert [b["old"] for b in rolled["update"]["batches"]] == [[n] for n in update["batches"][0]["new"]
                                                                               + update["batches"][1]["new"]]
                    assert {b["version"] for b in _backends(admin)} == {"v1"}
                    assert all(not pid_alive(pid) for b in update["batches"] for pid in b["new_pids"])
                finally:
                    _stop_started(rolled)
            finally:
                _stop_started(result)
        finally:
            stop.set()
            for c in clients:
                c.join(120)
    assert len(answered) > 10 and set(answered) == {200}, sorted(set(answered))


def test_a_budget_below_the_longest_request_terminates_it_and_the_count_is_right(tmp_path: Path) -> None:
    require_engine()
    with _pool(tmp_path, 1) as (_servers, gateway):
        front, admin = gateway.port(1), gateway.port(2)
        long_reply: list[tuple[int, dict[str, Any]]] = []

        def long() -> None:
            code, _, body = _post(f"http://127.0.0.1:{front}/v1/completions",
                                  {"model": "smollm2", "prompt": "Tell a long story", "max_tokens": 3000,
                                   "ignore_eos": True, "stream": False}, timeout=120)
            long_reply.append((code, body))

        client = threading.Thread(target=long)
        client.start()
        time.sleep(1.0)
        _plan(tmp_path, admin, wait_budget_s=1.0)
        done = _rollout(tmp_path, "--plan", "plan.json", "--json")
        client.join(120)
        assert done.returncode == 0, done.stderr[-3000:]
        print(done.stderr)
        result = json.loads(done.stdout)
        try:
            (batch,) = result["update"]["batches"]
            (drained,) = batch["drained"]
            assert drained["drain"]["decision"] == "terminate" and drained["terminated"] == 1
        finally:
            _stop_started(result)
    rows = [r for r in _rows(tmp_path / "summaries") if r.get("backend") == "old0"]
    assert sum(r["finish_reason"] == "server_draining" for r in rows) == drained["terminated"]
    assert long_reply and long_reply[0][0] != 200


def test_a_budget_that_runs_out_without_terminating_returns_the_backend_and_stops_the_update(tmp_path: Path) -> None:
    require_engine()
    with _pool(tmp_path, 1) as (servers, gateway):
        front, admin = gateway.port(1), gateway.port(2)

        def long() -> None:
            with contextlib.suppress(OSError):  # the gateway is stopped under it at the end
                _post(f"http://127.0.0.1:{front}/v1/completions",
                      {"model": "smollm2", "prompt": "Tell a long story", "max_tokens": 3000, "ignore_eos": True},
                      timeout=120)

        client = threading.Thread(target=long)
        client.start()
        time.sleep(1.0)
        _plan(tmp_path, admin, wait_budget_s=1.0, terminate_on_budget=False)
        done = _rollout(tmp_path, "--plan", "plan.json", "--json")
        assert done.returncode == 1, done.stderr[-3000:]
        result = json.loads(done.stdout)
        try:
            (batch,) = result["update"]["batches"]
            (drained,) = batch["drained"]
            assert result["update"]["outcome"] == "stopped" and batch["outcome"] == "stopped"
            assert drained["drain"]["decision"] == "return_to_pool" and drained["terminated"] == 0
            assert drained["stopped_pid"] is None and pid_alive(servers[0].process.pid)
            assert "returned to the pool (terminate_on_budget is false); the update stops here" in \
                " ".join(done.stderr.split())
            state = {b["id"]: b for b in _backends(admin)}
            assert state["old0"]["routable"] and state[batch["new"][0]]["routable"]
        finally:
            _stop_started(result)
            gateway.stop()
            client.join(120)
