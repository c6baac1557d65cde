"""A summary as a JSONL line: the native writer of its gaps reads back as exactly what json writes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.telemetry import _sink
from llmslo.telemetry._sink import JsonlWriter, encode_row

native = pytest.mark.skipif(_sink._seconds_json is None, reason="the native token log module is not built")

WHOLE_NS = st.integers(min_value=0, max_value=10**15 - 1).map(lambda n: n / 1e9)
"""Gaps as the token log makes them: whole nanoseconds over 1e9, up to 1e6 s."""
FINITE = st.floats(allow_nan=False, allow_infinity=False)


def _row(gaps: object, **more: object) -> dict[str, object]:
    return {"request_id": "r-1", "model": "m\u00e9", "ttft_s": 0.25, "generated_tokens": 9, "itl_s": gaps,
            "error_type": None, **more}


def _same(line: str, row: dict[str, object]) -> None:
    """``line`` reads back as ``row`` does through json, float for float, and every key but the gaps in order."""
    got, want = json.loads(line), json.loads(json.dumps(row, separators=(",", ":")))
    assert got == want
    for a, b in zip(got["itl_s"] or (), want["itl_s"] or (), strict=True):
        assert a == b and type(a) is type(b)
    assert [k for k in got if k != "itl_s"] == [k for k in want if k != "itl_s"]


@native
@settings(max_examples=300, deadline=None)
@given(st.lists(WHOLE_NS | FINITE, min_size=8, max_size=80))
def test_gaps_written_natively_read_back_as_the_same_floats(gaps: list[float]) -> None:
    _same(encode_row(_row(gaps)), _row(gaps))


@native
@settings(max_examples=300, deadline=None)
@given(WHOLE_NS)
def test_a_whole_number_of_nanoseconds_is_its_exact_decimal_never_longer_than_its_repr(x: float) -> None:
    assert _sink._seconds_json is not None
    text = _sink._seconds_json([x])[1:-1]
    assert float(text) == x and "e" not in text
    assert len(text) <= len(repr(x)) or "e" in repr(x)


@native
@pytest.mark.parametrize(("gaps", "text"), [
    ([0.000331782] * 8, "0.000331782"), ([1.5e-05] * 8, "0.000015"), ([0.0] * 8, "0.0"), ([2.0] * 8, "2.0"),
    ([0.1 + 0.2] * 8, "0.30000000000000004"), ([1e-300] * 8, "1e-300"), ([-0.5] * 8, "-0.5"),
    ([2e6] * 8, "2000000.0"),
])
def test_the_text_of_each_kind_of_gap(gaps: list[float], text: str) -> None:
    line = encode_row(_row(gaps))
    assert line.endswith(f',"itl_s":[{",".join([text] * 8)}]}}')
    _same(line, _row(gaps))


@pytest.mark.parametrize("gaps", [
    None, [], [0.1] * 7,                       # few or none: json writes them
    [1, 2, 3, 4, 5, 6, 7, 8],                  # not floats
    [0.1] * 7 + [True],
    [0.1] * 7 + [math.nan], [0.1] * 7 + [math.inf],   # what json writes as NaN and Infinity
    (0.1,) * 9,                                # not a list
])
def test_anything_else_is_written_by_json_as_it_was(gaps: Any) -> None:
    row = _row(gaps)
    assert encode_row(row) == json.dumps(row, separators=(",", ":"))


def test_without_the_native_module_every_row_is_written_by_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sink, "_seconds_json", None)
    row = _row([0.000331782] * 20)
    assert encode_row(row) == json.dumps(row, separators=(",", ":"))


def test_a_row_of_only_gaps_and_the_writers_file_read_back(tmp_path: Path) -> None:
    gaps = [n / 1e9 for n in range(1000, 1064)]
    assert json.loads(encode_row({"itl_s": gaps})) == {"itl_s": gaps}
    writer = JsonlWriter(tmp_path)
    rows = [_row(gaps), _row(None), _row([0.5] * 3)]
    writer.write(rows)
    writer.close()
    (path,) = writer.files
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3
    for line, row in zip(lines, rows, strict=True):
        _same(line, row)


@native
def test_the_benchmark_prints_both_encodings_for_each_length() -> None:
    import re
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "llmslo.bench.bench_summary_encoding", "--repeats", "1", "--rows",
                          "50"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "every row reads back as json's" in out.stdout
    for tokens in (20, 64, 256):
        assert re.search(rf"^ +{tokens} +\d+\.\d+ +\d+\.\d+ +\d+\.\d\dx$", out.stdout, re.M), out.stdout
