"""``llmslo serve`` on the command line: a bad flag exits 2 naming it (before anything listens), a missing
extra or a port in use exits 1 with what to do, ``--help`` documents every control's flags."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmslo.cli._app import app
from llmslo.server import ServerConfig, flag
from llmslo.server._config import config_fields

runner = CliRunner()


def _serve(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["serve", *args])
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize(("args", "message"), [
    (["--max-queue", "0"], "--max-queue: must be an integer >= 1, got 0"),
    (["--speed", "0"], "--speed: must be a finite number > 0, got 0.0"),
    (["--port", "70000"], "--port: must be a port number from 0 to 65535"),
    (["--error-rate", "1.5"], "--error-rate: must be a share from 0 to 1"),
    (["--breaker-error-rate", "1"], "--breaker-error-rate: must be a share strictly between 0 and 1"),
    (["--shed-queue-fraction", "0"], "--shed-queue-fraction: must be a fraction of the queue in (0, 1]"),
    (["--profile", "gpt/tpu"], "--profile: must be one of bloom-176b/a100-80gb"),
    (["--on-budget", "wait"], "--on-budget: must be one of terminate, return_to_pool, got 'wait'"),
    (["--drain-budget", "5"], "--drain-budget: invalid duration '5'"),
    (["--request-timeout", "soon"], "--request-timeout: invalid duration 'soon'"),
    (["--queue-timeout", "off"], "--queue-timeout: invalid duration 'off'"),
    (["--slo-ttft", "0"], "--slo-ttft: invalid duration '0'"),
    (["--tenant-classes", ","], "--tenant-classes: must be distinct non-empty class names"),
    (["--tenant-classes", "a,a"], "--tenant-classes: must be distinct non-empty class names"),
    (["--drain-record", "d.json"], "--drain-record: needs --next-version"),
    (["--rate-burst", "5"], "--rate-burst: needs --rate-limit"),
    (["--db", "s.duckdb", "--jsonl", "j"], "--db and --jsonl: choose one"),
    (["--no-telemetry", "--jsonl", "j"], "--no-telemetry keeps no summaries"),
    (["--kv-blocks", "-1"], "--kv-blocks: must be an integer >= 1"),
    (["--port", "eighty"], "Invalid value for '--port'"),
])
def test_a_bad_flag_exits_2_naming_it_and_starts_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         args: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    code, output = _serve(*args)
    assert code == 2, output
    assert message in output
    assert list(tmp_path.iterdir()) == []  # no store, no folder, no record


def test_the_help_names_every_flag_and_says_what_no_telemetry_is_for() -> None:
    code, output = _serve("--help")
    assert code == 0
    for name in config_fields():
        if name not in ("tenant_classes",):
            assert flag(name) in output, flag(name)
    assert "--tenant-classes" in output and "--no-breaker" in output
    assert "For the overhead benchmark only" in output


def test_each_config_field_is_one_flag_of_the_command() -> None:
    import typer

    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    options = {opt for param in command.params for opt in param.opts}
    assert {flag(name) for name in config_fields()} <= options | {"--no-breaker"}
    defaults = ServerConfig()
    assert (defaults.host, defaults.port, defaults.model) == ("127.0.0.1", 8000, "llmslo-sim")


def test_a_port_in_use_exits_1_saying_so() -> None:
    pytest.importorskip("uvicorn")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, output = _serve("--port", str(port))
    assert code == 1, output
    assert f"cannot listen on 127.0.0.1:{port}" in output


def test_without_the_serve_extra_the_command_says_how_to_install_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['uvicorn'] = None  # as if it were not installed: find_spec says None, import fails\n"
        "sys.argv = ['llmslo', 'serve', '--port', '0']\n"
        "from llmslo.cli import main\n"
        "main()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert "pip install 'llmslo[serve]'" in out.stderr


def test_importing_the_server_loads_no_heavy_dependency_and_not_uvicorn() -> None:
    heavy = ("polars", "duckdb", "scipy", "numpy", "typer", "pyarrow", "pandas", "rich", "uvicorn", "httpx")
    code = f"import sys, llmslo.server\nprint(','.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "", f"import llmslo.server loaded: {out.stdout.strip()}"


def test_the_server_facade_exports_a_sorted_complete_all() -> None:
    import llmslo.server as server

    assert list(server.__all__) == sorted(server.__all__)
    assert all(hasattr(server, name) for name in server.__all__)


def test_the_manual_names_every_flag() -> None:
    manual = (Path(__file__).resolve().parents[1] / "docs" / "server.md").read_text()
    missing = [flag(name) for name in config_fields() if flag(name) not in manual]
    assert not missing, f"docs/server.md does not document {missing}"
