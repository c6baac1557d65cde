"""The GPU run's engine and script (``bench/gpu_engine.py``, ``bench/gpu_run.sh``), on the CPU stand-in.

The GPU machine runs the script once per lent session; here, without a GPU, the same script runs the same path
(engine with ``LlmsloMiddleware``, ``llmslo load``, the server's summaries ingested, client and server rows
joined) with ``GPU_ENGINE_SIZE=cpu-stub``, so that the script still works when a GPU is next lent.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from llmslo.bench.gpu_engine import EngineApp, StubSource, tokenize, word

REPO = Path(__file__).resolve().parents[1]


def test_the_script_runs_the_engine_the_load_and_the_join_without_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "GPU_ENGINE_SIZE": "cpu-stub", "LOAD_S": "4", "OUT": str(out), "PY": sys.executable,
           "CAL_TOKENS": "16", "OUTPUT_TOKENS": "8-24", "PORT": str(_free_port())}
    done = subprocess.run(["bash", str(REPO / "bench" / "gpu_run.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    log = (out / "run.log").read_text()
    assert done.returncode == 0, log[-3000:]
    joined = re.search(r"client/server join on request_id: (\d+) requests; generated tokens server (\d+) vs "
                       r"client (\d+); prompt tokens \(server\) (\d+); same finish reason (\d+) of (\d+)", log)
    assert joined, log[-3000:]
    n, gen_server, gen_client, prompt, same, of = map(int, joined.groups())
    assert n > 0 and gen_server == gen_client > 0 and prompt > 0 and same == of == n
    assert "store run.duckdb: " in log and "request summaries" in log  # the server's rows were ingested
    calibration = json.loads((out / "calibration.json").read_text())
    assert calibration["aggregate_tokens_per_s"] > 0
    assert json.loads((out / "load.json").read_text())["load"]["attempted"] == n
    for name in ("run.duckdb", "client.duckdb"):
        assert (out / name).stat().st_size > 0


def _free_port() -> int:
    from llmslo.tests._middleware_app import free_port

    return free_port()


class _Failing:
    name = "fails after two tokens"

    def generate(self, prompt_ids: list[int], max_tokens: int, emit: Callable[[int], None],
                 stop: threading.Event) -> None:
        emit(1)
        emit(2)
        raise RuntimeError("CUDA error: an illegal memory access")


def _post(app: EngineApp, body: dict[str, object], path: str = "/v1/completions") -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.post(path, json=body)

    return asyncio.run(go())


def test_a_failed_generation_reaches_the_client_as_an_error_not_a_short_reply() -> None:
    app = EngineApp(_Failing(), "m", slots=1)
    streamed = _post(app, {"prompt": "hi", "max_tokens": 8, "stream": True})
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert [e["choices"][0]["text"] for e in events[:2]] == [word(1), word(2)]
    assert events[-1] == {"error": {"message": "RuntimeError: CUDA error: an illegal memory access",
                                    "type": "server_error"}}
    whole = _post(app, {"prompt": "hi", "max_tokens": 8})
    assert whole.status_code == 500 and "illegal memory access" in whole.json()["error"]["message"]


def test_a_reply_runs_to_max_tokens_with_usage_and_the_prompt_counts_bytes() -> None:
    app = EngineApp(StubSource(token_s=0.0, prefill_s=0.0), "m", slots=2)
    body = {"messages": [{"role": "user", "content": "héllo"}], "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    reply = _post(app, body, "/v1/chat/completions")
    events = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
    assert sum(1 for e in events if e["choices"] and e["choices"][0]["delta"].get("content")) == 5
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"] == {"prompt_tokens": len("héllo".encode()), "completion_tokens": 5, "total_tokens": 11}
    assert reply.text.endswith("data: [DONE]\n\n")
    assert tokenize("é") == [0xC3 + 3, 0xA9 + 3]


@pytest.mark.parametrize("body", [{"prompt": ""}, {"prompt": "x", "max_tokens": 0}, {"nope": 1}])
def test_bad_requests_get_400_and_start_nothing(body: dict[str, object]) -> None:
    app = EngineApp(_Failing(), "m", slots=1)
    reply = _post(app, body)
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error"
