"""The ASGI middleware on a real Python engine: llama-cpp-python's OpenAI server (SmolLM2-135M), its app built with
``create_app`` and the middleware added as ``docs/middleware.md`` shows (``tests/_llama_cpp_python_app.py``),
under uvicorn on 127.0.0.1, its summaries written as JSONL (``LLMSLO_SUMMARY_PATH``) and read once it exited.

1. ``llmslo load`` (the installed command, from a plain working directory): a calm run of streamed chats; every
   attempt succeeds, one middleware summary per client row on the same request id, the same finish reason and
   tokens, the server's TTFT at most the client's. llama-cpp-python's streams carry no ``usage`` (it ignores
   ``stream_options``): both sides count content chunks, and the middleware has no prompt tokens to read.
2. An ``X-Request-Id`` that is not a UUID: llama-cpp-python answers 400 with an empty body (its starlette-context
   ``RequestIdPlugin``), which reaches the client as the bare server sends it, and the summary says
   ``error`` / ``http_400``; a UUID of another version passes.
3. A whole (non-streamed) reply: one summary, its tokens from the reply's ``usage``.
4. With the server's default ``interrupt_requests``, a stream is cut (``[DONE]`` without a finish reason) when
   another request waits: the summary says ``error`` / ``truncated``.
5. ``docs/middleware.md``'s snippet, written to a file beside the model and served as its comment shows (the same
   factory, ``--factory`` and summary folder; the port the OS picks): it serves, and it sets what
   ``tests/_llama_cpp_python_app.py`` sets.

The engine is built once per machine by ``.ci/build-llama-cpp-python`` (the wheel) and ``.ci/build-llama-server``
(the model); ``.ci/setup`` runs both and installs the wheel. Without them the tests fail with the command to
run, except where no C++ compiler exists and CI is not set (then they skip, saying so).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmslo.ops import MODEL_FILE, find_model
from llmslo.tests._llama_cpp_python_app import ALIAS, CONTEXT_TOKENS, LLAMA_CPP_PYTHON_VERSION, THREADS
from llmslo.tests._middleware_app import Uvicorn, read_jsonl

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DOC = Path(__file__).resolve().parents[1] / "docs" / "middleware.md"

VERSION = "lcp-1"
"""The ``version`` the middleware writes on every summary (``LLMSLO_VERSION``)."""
MAX_TOKENS = 16
"""``max_tokens`` of the load's requests."""


def require_engine() -> None:
    """Skip where no C++ compiler exists (llama-cpp-python cannot be built here) and CI is not set; fail where one
    does and llama-cpp-python, its ``server`` extra or the model is missing, naming the command that gets them."""
    missing = []
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("starlette_context") is None:
        missing.append("llama-cpp-python with its server extra is not installed")
    elif importlib.metadata.version("llama_cpp_python") != LLAMA_CPP_PYTHON_VERSION:
        missing.append(f"llama-cpp-python {importlib.metadata.version('llama_cpp_python')} is installed, "
                       f"not {LLAMA_CPP_PYTHON_VERSION}")
    if find_model() is None:
        missing.append("the SmolLM2 model is not cached")
    if not missing:
        return
    if shutil.which("g++") is None and shutil.which("c++") is None and not os.environ.get("CI"):
        pytest.skip(f"{'; '.join(missing)}, and no C++ compiler exists to build it (.ci/build-llama-cpp-python)")
    pytest.fail(f"{'; '.join(missing)}: run .ci/setup (it builds the wheel once with .ci/build-llama-cpp-python, "
                "caches the model with .ci/build-llama-server, and installs the wheel with its server extra)")


@contextlib.contextmanager
def served(factory: str, summaries: Path) -> Iterator[Uvicorn]:
    """``factory`` of ``tests/_llama_cpp_python_app.py`` under uvicorn, its summaries written into ``summaries``
    (complete once this exits: the sink is flushed when uvicorn shuts the app down)."""
    require_engine()
    server = Uvicorn(f"llmslo.tests._llama_cpp_python_app:{factory}", factory=True, lifespan="on", timeout_s=120,
                     env={"LLMSLO_SUMMARY_PATH": str(summaries), "LLMSLO_VERSION": VERSION})
    try:
        yield server
    finally:
        code = server.stop()
    assert code in (0, -15), "".join(server.log)  # uvicorn re-raises SIGTERM once it has shut down


def _events(body: bytes) -> list[Any]:
    """The ``data:`` payloads of an event stream, ``[DONE]`` as the string."""
    return [payload if payload == "[DONE]" else json.loads(payload)
            for line in body.decode().splitlines() if line.startswith("data: ")
            for payload in [line[len("data: "):]]]


def test_llmslo_load_streams_match_the_middleware_summaries_one_to_one(tmp_path: Path) -> None:
    work, summaries = tmp_path / "work", tmp_path / "server"
    work.mkdir()
    script = Path(sys.executable).with_name("llmslo")  # the installed command, beside the interpreter
    command = [str(script)] if script.exists() else [sys.executable, "-m", "llmslo.cli"]
    with served("make_app", summaries) as server:
        load = subprocess.run(
            [*command, "load", server.url, "--endpoint", "chat", "--rate", "4", "--max-requests", "8",
             "--prompt-tokens", "8-24", "--output-tokens", str(MAX_TOKENS), "--max-concurrency", "2", "--seed", "5",
             "--jsonl", "client", "--no-progress"], cwd=work, capture_output=True, text=True, timeout=300)
        check = subprocess.run([*command, "check", server.url, "--json"], cwd=work, capture_output=True, text=True,
                               timeout=300)
    assert load.returncode == 0, load.stdout + load.stderr
    # llmslo check finds its one request among the engine's exemplars, the model taken from /v1/models
    assert check.returncode == 0, check.stdout + check.stderr
    found = json.loads(check.stdout)
    assert (found["verdict"], found["model"]) == ("recorded", ALIAS), found
    assert 0 < found["server_ttft_s"] <= found["request"]["client_ttft_s"], found
    out = load.stdout
    assert re.search(r"^schedule: .*: 8 arrivals over ", out, re.M), out
    assert re.search(rf"^target: {re.escape(server.url)}/v1/chat/completions  model: {ALIAS}  ", out, re.M), out
    assert ("tokens: counted content chunks (no usage in 8 of 8 replies; one token per chunk); "
            "prompt tokens: the words sent (no usage)") in out, out
    assert re.search(r"^Attempted requests: +8$", out, re.M) and re.search(
        r"^Successful requests \(stop, length\): +8$", out, re.M), out
    client = {r["request_id"]: r for r in read_jsonl(work / "client")}
    mine = {r["request_id"]: r for r in read_jsonl(summaries)}
    assert mine.pop(found["request"]["request_id"])["finish_reason"] == found["request"]["finish_reason"]
    assert len(client) == 8 and all(uuid.UUID(rid).version == 4 for rid in client)
    assert set(mine) == set(client)
    for rid, c in client.items():
        m = mine[rid]
        assert c["finish_reason"] in ("stop", "length"), c
        assert (m["model"], m["version"], m["finish_reason"]) == (ALIAS, VERSION, c["finish_reason"]), (m, c)
        assert (m["generated_tokens"], m["sent_tokens"]) == (c["generated_tokens"], c["sent_tokens"]), (m, c)
        assert 1 <= m["generated_tokens"] <= MAX_TOKENS, m
        assert m["prompt_tokens"] == 0 and c["prompt_tokens"] >= 8, (m, c)  # no usage in the stream to read
        assert m["ttft_s"] is not None and c["client_ttft_s"] is not None, (m, c)
        assert m["ttft_s"] <= c["client_ttft_s"], (m, c)


def test_an_id_that_is_not_a_uuid_gets_the_servers_own_empty_400_and_an_http_400_summary(tmp_path: Path) -> None:
    body = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 1}
    with served("bare_app", tmp_path / "bare") as bare, httpx.Client(base_url=bare.url, timeout=60) as client:
        own = client.post("/v1/chat/completions", json=body, headers={"x-request-id": "not-a-uuid"})
    uuid7 = "0190f3c2-7d4e-7a1b-9c2d-3e4f5a6b7c8d"  # a UUID, of version 7 (as llmslo load --request-id uuid7 sends)
    with served("make_app", tmp_path / "server") as server, httpx.Client(base_url=server.url, timeout=60) as client:
        seen = client.post("/v1/chat/completions", json=body, headers={"x-request-id": "not-a-uuid"})
        passed = client.post("/v1/chat/completions", json=body, headers={"x-request-id": uuid7})
    assert (own.status_code, own.content) == (400, b"")
    assert (seen.status_code, seen.content) == (own.status_code, own.content)

    def headers(r: httpx.Response) -> list[tuple[str, str]]:
        return [(k, v) for k, v in r.headers.multi_items() if k not in ("date", "x-request-id")]

    assert headers(seen) == headers(own), (seen.headers, own.headers)
    assert "x-request-id" not in own.headers and seen.headers.get_list("x-request-id") == ["not-a-uuid"]
    assert passed.status_code == 200 and passed.headers["x-request-id"] == uuid7, passed.text
    rows = {r["request_id"]: r for r in read_jsonl(tmp_path / "server")}
    assert set(rows) == {"not-a-uuid", uuid7}
    refused = rows["not-a-uuid"]
    assert (refused["finish_reason"], refused["error_type"], refused["generated_tokens"]) == ("error", "http_400", 0)
    assert rows[uuid7]["finish_reason"] == passed.json()["choices"][0]["finish_reason"]


def test_a_whole_reply_gives_one_summary_with_the_tokens_of_its_usage(tmp_path: Path) -> None:
    rid = str(uuid.uuid4())
    body = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 12}
    with served("make_app", tmp_path / "server") as server, httpx.Client(base_url=server.url, timeout=60) as client:
        reply = client.post("/v1/chat/completions", json=body, headers={"x-request-id": rid})
    assert reply.status_code == 200 and reply.headers["x-request-id"] == rid, reply.text
    doc = reply.json()
    usage = doc["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0, doc
    (row,) = read_jsonl(tmp_path / "server")
    assert row["request_id"] == rid
    assert (row["finish_reason"], row["generated_tokens"], row["sent_tokens"], row["prompt_tokens"]) == (
        doc["choices"][0]["finish_reason"], usage["completion_tokens"], usage["completion_tokens"],
        usage["prompt_tokens"]), (row, doc)
    assert row["ttft_s"] is not None and row["ttft_s"] == row["last_token_s"]  # one event: the whole reply


def test_a_stream_the_engine_interrupts_for_a_waiting_request_is_recorded_truncated(tmp_path: Path) -> None:
    """llama-cpp-python's default ``interrupt_requests``: the stream ends with ``[DONE]`` and no finish reason."""
    long, short = str(uuid.uuid4()), str(uuid.uuid4())
    waiting: list[httpx.Response] = []
    with served("engine_defaults_app", tmp_path / "server") as server, \
            httpx.Client(base_url=server.url, timeout=60) as client:

        def send_another() -> None:
            with httpx.Client(base_url=server.url, timeout=60) as other:
                waiting.append(other.post("/v1/chat/completions", headers={"x-request-id": short}, json={
                    "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 2}))

        sender = threading.Thread(target=send_another)
        body, started = b"", False
        with client.stream("POST", "/v1/chat/completions", headers={"x-request-id": long}, json={
                "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
                "max_tokens": 400, "stream": True}) as r:
            for part in r.iter_bytes():
                body += part
                if b'"content": "' in body and not started:
                    sender.start()  # once the first token is in: the second request waits for the model
                    started = True
            status = r.status_code
        if started:
            sender.join(timeout=60)
    events = _events(body)
    assert status == 200 and events[-1] == "[DONE]", body
    chunks = [e for e in events[:-1] if e["choices"][0]["delta"].get("content")]
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1]), body  # cut, not finished
    assert waiting and waiting[0].status_code == 200, waiting
    rows = {r["request_id"]: r for r in read_jsonl(tmp_path / "server")}
    assert (rows[long]["finish_reason"], rows[long]["error_type"]) == ("error", "truncated"), rows[long]
    assert rows[long]["generated_tokens"] == len(chunks) < 400, (rows[long], len(chunks))
    assert rows[short]["finish_reason"] == waiting[0].json()["choices"][0]["finish_reason"]


def _documented_snippet() -> str:
    """The Python block of ``docs/middleware.md``'s llama-cpp-python paragraph."""
    doc = DOC.read_text()
    found = re.search(r"```python\n(.*?)```", doc[doc.index("**llama-cpp-python**"):], re.S)
    assert found is not None, "docs/middleware.md: no Python block after **llama-cpp-python**"
    return found.group(1)


def _keywords(code: str) -> dict[str, dict[str, Any]]:
    """The constant keyword arguments of each call in ``code``, by the called name (the last one wins)."""
    return {node.func.id if isinstance(node.func, ast.Name) else node.func.attr:
            {k.arg: k.value.value for k in node.keywords if isinstance(k.value, ast.Constant) and k.arg}
            for node in ast.walk(ast.parse(code))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute)}


def test_the_documented_snippet_serves_beside_the_model_with_the_factorys_settings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snippet = _documented_snippet()
    calls = _keywords(snippet)
    assert calls["ServerSettings"] == {"interrupt_requests": False}
    assert calls["ModelSettings"] == {"model": MODEL_FILE, "model_alias": ALIAS, "n_ctx": CONTEXT_TOKENS,
                                      "n_threads": THREADS, "n_threads_batch": THREADS, "verbose": False}
    assert calls["add_middleware"] == {"model": ALIAS}
    assert "LLMSLO_SUMMARY_PATH=summaries uvicorn serve_llama_cpp_python:make_app --factory " in snippet
    require_engine()
    model = find_model()
    assert model is not None
    (tmp_path / MODEL_FILE).symlink_to(model.absolute())
    (tmp_path / "serve_llama_cpp_python.py").write_text(snippet)
    monkeypatch.chdir(tmp_path)  # uvicorn imports the file, and the app opens the model, from here
    server = Uvicorn("serve_llama_cpp_python:make_app", factory=True, lifespan="on", timeout_s=120,
                     env={"LLMSLO_SUMMARY_PATH": "summaries"})
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client, client.stream(
                "POST", "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Say hi"}],
                                                      "max_tokens": 4, "stream": True}) as r:
            status, rid, body = r.status_code, r.headers["x-request-id"], r.read()
    finally:
        code = server.stop()
    assert code in (0, -15), "".join(server.log)
    events = _events(body)
    assert status == 200 and events[-1] == "[DONE]", body
    chunks = [e for e in events[:-1] if e["choices"][0]["delta"].get("content")]
    (row,) = read_jsonl(tmp_path / "summaries")
    assert (row["request_id"], row["model"]) == (rid, ALIAS) and uuid.UUID(rid).version == 4
    assert (row["finish_reason"], row["generated_tokens"]) == (events[-2]["choices"][0]["finish_reason"], len(chunks))
