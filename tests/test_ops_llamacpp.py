"""Starting llama.cpp's ``llama-server`` (llmslo.ops): the binary and the model are handed over as absolute
paths, so what was found is what runs, from any working directory. A stand-in script plays the engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmslo.ops import locate_engine, running_llama_server
from llmslo.ops._llamacpp import MODEL_FILE, find_model
from llmslo.telemetry import LlmsloError

FAKE = """#!/bin/sh
printf '%s\\n' "$0" "$@" > argv.txt
exit 3
"""


def test_a_binary_and_model_named_relative_to_the_working_directory_are_the_ones_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``LLMSLO_LLAMA_SERVER=llama-server`` names the file here (that is what was checked): run as a bare name
    it would have been looked up on PATH instead, a different binary or none."""
    monkeypatch.chdir(tmp_path)
    Path("llama-server").write_text(FAKE)
    os.chmod("llama-server", 0o755)
    Path("model.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("LLMSLO_LLAMA_SERVER", "llama-server")
    monkeypatch.setenv("LLMSLO_GGUF", "model.gguf")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no llama-server on it
    assert locate_engine() == (tmp_path / "llama-server", tmp_path / "model.gguf")
    with pytest.raises(LlmsloError, match="exited with status 3"), running_llama_server(Path("run"), parallel=1,
                                                                                        health_timeout_s=20):
        pass
    argv = Path("argv.txt").read_text().splitlines()
    assert argv[0] == str(tmp_path / "llama-server")
    assert argv[argv.index("--model") + 1] == str(tmp_path / "model.gguf")


def test_the_middlewares_model_label_is_not_taken_for_a_model_file(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``LLMSLO_MODEL`` is the middleware's model label (``vllm serve --middleware`` reads it); the engine's GGUF file
    is ``LLMSLO_GGUF``: a process that sets the label still runs the cached model, or the file named."""
    monkeypatch.setenv("LLMSLO_ENGINE_CACHE", str(tmp_path / "cache"))
    cached = tmp_path / "cache" / "models" / MODEL_FILE
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"GGUF")
    monkeypatch.setenv("LLMSLO_MODEL", "llama-3.1-8b")
    monkeypatch.delenv("LLMSLO_GGUF", raising=False)
    assert find_model() == cached
    monkeypatch.setenv("LLMSLO_GGUF", str(tmp_path / "other.gguf"))
    assert find_model() == tmp_path / "other.gguf"
