"""Token counts: streams ask for usage (``stream_options``) until the server refuses the field (a 400 or 422 whose
body names it), then the run goes on without it and says so; each row's tokens come from ``usage`` where the server
sent it, else from the content chunks counted, and the summary says which."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmslo.loadgen import TokenSources
from llmslo.tests._loadgen_server import ServerProcess
from llmslo.tests._loadgen_util import at, llmslo, only, run

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess() as srv:
        yield srv


# ---- stream_options ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 422])
def test_a_refused_stream_options_is_dropped_for_the_rest_of_the_run(server: ServerProcess, status: int) -> None:
    result, entries = run(server.url(refuse_stream_options=status, tokens=3), at(0.0, 0.3, 0.35, 0.4))
    first, *rest = sorted(entries, key=lambda e: e["index"])
    assert first["status"] == status and first["refused_stream_options"] and first["asked_usage"]
    assert first["error_type"] == f"http_{status}" and "stream_options" in first["cause"]
    assert [(e["status"], e["finish_reason"], e["asked_usage"]) for e in rest] == [(200, "length", False)] * 3
    for e in rest:
        assert "stream_options" not in server.stats(e["request_id"])["body"]
    assert result.stream_options == "dropped"
    refusal = result.stream_options_refusal
    assert refusal is not None and (refusal.index, refusal.status, refusal.refused) == (0, status, 1)
    assert "stream_options" in refusal.body
    assert any("the server refused stream_options" in n for n in result.notes())
    # the replies after it carry no usage: their tokens are the chunks counted, and the summary says so
    assert result.tokens == TokenSources(replies=3, from_usage=0, counted_chunks=3, prompt_from_usage=0)
    assert [r["generated_tokens"] for r in result.rows if r["finish_reason"] == "length"] == [3, 3, 3]


def test_a_400_that_does_not_name_stream_options_keeps_it(server: ServerProcess) -> None:
    result, entries = run(server.url(status=400), at(0.0, 0.2))
    assert all(e["asked_usage"] and not e["refused_stream_options"] for e in entries)
    assert result.stream_options == "sent" and result.stream_options_refusal is None


def test_stream_options_can_be_switched_off(server: ServerProcess) -> None:
    result, entries = run(server.url(tokens=2), at(0.0), stream_options=False)
    assert "stream_options" not in server.stats(entries[0]["request_id"])["body"]
    assert result.stream_options == "off"


# ---- where the tokens come from --------------------------------------------------------------------------------


def test_tokens_from_usage_are_said_so(server: ServerProcess) -> None:
    result, entries = run(server.url(tokens=4), at(0.0, 0.01))
    assert [e["token_source"] for e in entries] == ["usage", "usage"]
    assert result.tokens.describe() == "tokens: from usage (2 of 2 replies); prompt tokens from usage"


def test_a_whole_reply_without_usage_counts_its_text_as_one_chunk(server: ServerProcess) -> None:
    """Before, a whole reply without usage had 0 tokens and no TTFT although its text arrived."""
    row, entry = only(server.url(usage=0, tokens=5), stream=False)
    assert row["finish_reason"] == "length" and row["generated_tokens"] == row["sent_tokens"] == 1
    assert row["ttft_s"] is not None and row["ttft_s"] == row["last_token_s"]
    assert entry["token_source"] == "chunks" and row["prompt_tokens"] == 4  # the words sent


def test_a_mixed_run_says_how_many_replies_had_usage() -> None:
    mixed = TokenSources(replies=5, from_usage=3, counted_chunks=1, prompt_from_usage=3)
    assert mixed.describe() == ("tokens: from usage in 3 of 5 replies, counted content chunks in 1 (no usage; one "
                                "token per chunk), none in 1 (no content, no usage); prompt tokens from usage in "
                                "3, else the words sent")
    assert TokenSources().describe().startswith("tokens: none counted")


# ---- the installed command -------------------------------------------------------------------------------------


def test_the_installed_command_goes_on_without_a_refused_stream_options_and_says_so(
        tmp_path: Path, server: ServerProcess) -> None:
    url = server.url(refuse_stream_options=400, tokens=3)
    ran = llmslo("load", url, "--rate", "5", "--max-requests", "4", "--json", "--attempts-log", "attempts.jsonl",
                 cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    doc = json.loads(ran.stdout)["run"]
    refused = doc["stream_options_refusal"]["refused"]
    assert doc["stream_options"] == "dropped" and doc["stream_options_refusal"]["index"] == 0 and refused >= 1
    assert doc["finish"] == {"error": refused, "length": 4 - refused}
    (cause,) = doc["causes"]["error"]
    assert cause["count"] == refused and cause["cause"].startswith('HTTP 400 {"error": {"message": "Unknown field: '
                                                                   'stream_options"')
    assert doc["tokens"]["summary"].startswith(f"tokens: counted content chunks (no usage in {4 - refused} of "
                                               f"{4 - refused} replies")
    ran = llmslo("load", url, "--rate", "5", "--max-requests", "4", "--no-progress", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "note: the server refused stream_options (HTTP 400 naming it, answering attempt 0)" in ran.stdout
    assert "tokens: counted content chunks" in ran.stdout
    ran = llmslo("load", url, "--rate", "5", "--max-requests", "2", "--no-stream-options", "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    doc = json.loads(ran.stdout)["run"]
    assert doc["stream_options"] == "off" and doc["finish"] == {"length": 2}
    assert doc["config"]["stream_options"] is False
