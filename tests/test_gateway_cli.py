"""``llmslo gateway`` as a person runs it: the installed command, from a plain folder, relative paths; bad input
gets the field and the fix, exit 2 for the command line and 1 for what it talks to."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]


def llmslo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmslo.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_no_backend_is_a_usage_error_that_says_what_to_give(tmp_path: Path) -> None:
    r = llmslo(tmp_path, "gateway", "--port", "0")
    assert r.returncode == 2 and "--backend URL (repeat it) or --pool FILE" in r.stderr


@pytest.mark.parametrize(("text", "message"), [
    ("backends:\n  - id: a\n", "pool.yaml: backend 1: url is missing (http://HOST:PORT)"),
    ("backends:\n  - url: http://127.0.0.1:1/v1\n", "must be http://HOST:PORT (plain HTTP, no path)"),
    ("backends:\n  - {url: 'http://127.0.0.1:1', slot: 2}\n", "backend 1: unknown key(s) slot"),
    ("servers: []\n", "expected a mapping with a 'backends' list"),
    ("backends:\n  - {id: a, url: 'http://127.0.0.1:1'}\n  - {url: 'http://127.0.0.1:2'}\n"
     "  - {id: a, url: 'http://127.0.0.1:3'}\n", "pool.yaml: backend 3: id 'a' is backend 1's too; ids must be unique"),
])
def test_a_bad_pool_file_names_the_backend_and_the_fix(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "pool.yaml").write_text(text)
    r = llmslo(tmp_path, "gateway", "--pool", "pool.yaml", "--port", "0")
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_the_admin_commands_say_when_no_gateway_answers(tmp_path: Path) -> None:
    r = llmslo(tmp_path, "gateway", "drain", "a", "--admin", "http://127.0.0.1:9")
    assert r.returncode == 1 and "no gateway admin API there" in r.stderr and "--admin URL" in r.stderr


def test_bad_slots_on_a_backend_is_a_usage_error_that_names_it_once(tmp_path: Path) -> None:
    r = llmslo(tmp_path, "gateway", "--backend", "a=http://127.0.0.1:1@v1,slots=four", "--port", "0")
    assert r.returncode == 2, r.stderr
    assert "--backend: 'a=http://127.0.0.1:1@v1,slots=four': slots='four' is not a whole number" in r.stderr
    assert "a=http://127.0.0.1:8001@v1,slots=4" in r.stderr and r.stderr.count("--backend") == 1


@pytest.mark.parametrize(("text", "option", "hint"), [
    ("http://127.0.0.1:1,engine=llamacpp", "engine=llamacpp", "--engine-metrics ENGINE"),
    ("a=http://127.0.0.1:1@v1,slots=4,weight=2", "weight=2", ""),
])
def test_an_unknown_option_on_a_backend_is_a_usage_error_that_names_it(tmp_path: Path, text: str, option: str,
                                                                       hint: str) -> None:
    r = llmslo(tmp_path, "gateway", "--backend", text, "--port", "0")
    assert r.returncode == 2, r.stderr
    assert f"--backend: {text!r}: {option!r} is not a backend option: write [ID=]URL[@VERSION][,slots=N]" in r.stderr
    assert hint in r.stderr and "bad port" not in r.stderr


def test_a_bad_reserve_quantile_is_a_usage_error_with_an_example(tmp_path: Path) -> None:
    r = llmslo(tmp_path, "gateway", "--backend", "http://127.0.0.1:1", "--tokens-per-min", "6000",
               "--reserve-quantile", "1.5", "--port", "0")
    assert r.returncode == 2, r.stderr
    assert "reserve_quantile: must be a fraction in (0, 1], e.g. --reserve-quantile 0.9; got 1.5" in r.stderr


def test_a_backends_slots_set_its_limit_and_gateway_status_shows_both(tmp_path: Path) -> None:
    import re

    from llmslo.ops._live_processes import GATEWAY_READY, ready_match, ready_port, started

    exe = Path(sys.executable).with_name("llmslo")
    if not exe.exists():
        pytest.skip(f"no installed llmslo command beside {sys.executable}")
    with started([str(exe), "serve", "--port", "0"], tmp_path / "serve.log", stdout=subprocess.PIPE) as serve:
        url = f"http://127.0.0.1:{ready_port(serve)}"
        with started([str(exe), "gateway", "--backend", f"a={url}@v1,slots=4", "--port", "0", "--admin-port", "0"],
                     tmp_path / "gateway.log", stdout=subprocess.PIPE) as gateway:
            admin = f"http://127.0.0.1:{ready_match(gateway, GATEWAY_READY, 'llmslo gateway').group(2)}"
            r = subprocess.run([str(exe), "gateway", "status", "--admin", admin], cwd=tmp_path, capture_output=True,
                               text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    line = rf"^a  {re.escape(url)}  version v1  .*  slots 4  limit 8  tokens 0/-  outstanding 0  served 0"
    assert re.search(line, r.stdout, re.M), r.stdout

