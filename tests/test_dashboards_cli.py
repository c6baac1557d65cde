"""``llmslo dashboards generate``, as a user runs it: files, ``--json``, bad specs, atomic writes, help."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmslo.cli._app import app
from llmslo.cli._dashboards import dashboards_app
from llmslo.dashboards import Dashboard
from llmslo.tests._dashboards import EXAMPLE, GOLDEN

runner = CliRunner()


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_generate_with_a_spec_writes_the_golden_dashboards_of_that_spec(tmp_path: Path) -> None:
    out = tmp_path / "dashboards"
    result = runner.invoke(app, ["dashboards", "generate", "--spec", str(EXAMPLE), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["llmslo-chat-serving.json", "llmslo-chat-slo.json"]
    for path in out.iterdir():
        assert path.read_bytes() == (GOLDEN / path.name).read_bytes(), path.name
    assert f"wrote {out / 'llmslo-chat-serving.json'}: llmslo serving: chat" in _flat(result.output)
    assert "Dashboards > New > Import" in result.output


def test_generate_without_a_spec_writes_the_catalogue_dashboards(tmp_path: Path) -> None:
    result = runner.invoke(dashboards_app, ["generate", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llmslo-serving.json", "llmslo-slo.json"]
    for path in tmp_path.iterdir():
        assert path.read_bytes() == (GOLDEN / path.name).read_bytes(), path.name


def test_json_lists_every_written_file(tmp_path: Path) -> None:
    result = runner.invoke(dashboards_app, ["generate", "--spec", str(EXAMPLE), "-o", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["spec"] == str(EXAMPLE)
    assert [(f["kind"], f["uid"], Path(f["path"]).name) for f in data["files"]] == [
        ("serving", "llmslo-chat-serving", "llmslo-chat-serving.json"),
        ("slo", "llmslo-chat-slo", "llmslo-chat-slo.json")]
    for f in data["files"]:
        written = json.loads(Path(f["path"]).read_text())
        assert written["title"] == f["title"]
        assert f["panels"] == sum(1 for p in written["panels"] if p["type"] != "row")
        assert f["queries"] == sum(len(p.get("targets", ())) for p in written["panels"])


def test_an_invalid_spec_exits_1_naming_the_file_and_the_field_and_writes_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(EXAMPLE.read_text().replace("threshold: 2s", "threshold: 3s"))
    out = tmp_path / "out"
    result = runner.invoke(dashboards_app, ["generate", "--spec", str(spec), "-o", str(out)])
    assert result.exit_code == 1
    assert "bad.yaml: objectives[1].threshold: 3s is not a bucket bound of llmslo_ttft_seconds" in _flat(result.output)
    assert not out.exists()


def test_a_missing_spec_exits_1_naming_it(tmp_path: Path) -> None:
    result = runner.invoke(dashboards_app, ["generate", "--spec", str(tmp_path / "nope.yaml"), "-o", str(tmp_path)])
    assert result.exit_code == 1
    assert f"cannot read {tmp_path / 'nope.yaml'}" in _flat(result.output)
    assert list(tmp_path.iterdir()) == []


def test_an_output_that_is_a_file_exits_1_and_leaves_it_alone(tmp_path: Path) -> None:
    target = tmp_path / "dashboards"
    target.write_text("mine")
    result = runner.invoke(dashboards_app, ["generate", "-o", str(target)])
    assert result.exit_code == 1
    assert f"{target} is a file" in _flat(result.output)
    assert target.read_text() == "mine"


def test_a_failed_write_replaces_no_file_and_leaves_no_temporary_file(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "llmslo-chat-serving.json").write_text("previous serving\n")
    real_text = Dashboard.text

    def text(self: Dashboard) -> str:
        if self.kind == "slo":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_text(self)

    monkeypatch.setattr(Dashboard, "text", text)
    result = runner.invoke(dashboards_app, ["generate", "--spec", str(EXAMPLE), "-o", str(tmp_path)])
    assert result.exit_code == 1
    assert f"cannot write the dashboards into {tmp_path}: No space left on device" in _flat(result.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llmslo-chat-serving.json"]
    assert (tmp_path / "llmslo-chat-serving.json").read_text() == "previous serving\n"


def test_help_says_what_is_generated_and_how_to_import_it() -> None:
    result = runner.invoke(app, ["dashboards", "generate", "--help"])
    assert result.exit_code == 0
    text = _flat(result.output)
    for words in ("serving and SLO dashboards", "--spec", "llmslo rules generate", "Dashboards > New > Import",
                  '"datasource"', '"job"', "--json"):
        assert words in text, words
    assert "--enable-feature=exemplar-storage" in "".join(text.split())  # the help wraps at any hyphen
    top = _flat(runner.invoke(app, ["dashboards", "--help"]).output)
    assert "generate" in top and "request_id exemplars" in top
