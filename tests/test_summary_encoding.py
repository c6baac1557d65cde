"""A summary as a JSONL line: the native writer (``summary_json``) writes what json writes, float for float."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.telemetry import _sink
from llmslo.telemetry._sink import JsonlWriter, encode_row

native = pytest.mark.skipif(_sink._summary_json is None, reason="the native token log module is not built")

WHOLE_NS = st.integers(min_value=0, max_value=10**15 - 1).map(lambda n: n / 1e9)
"""Times and gaps as the token log makes them: whole nanoseconds over 1e9, up to 1e6 s."""
FINITE = st.floats(allow_nan=False, allow_infinity=False)
SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | WHOLE_NS | FINITE
           | st.text())
ROWS = st.dictionaries(st.text(), SCALARS | st.lists(SCALARS, max_size=70), max_size=25)


def _json(row: object) -> str:
    return json.dumps(row, separators=(",", ":"))


def _whole_ns(x: float) -> bool:
    return 0 <= x < 1e6 and math.copysign(1.0, x) > 0 and round(x * 1e9) / 1e9 == x


def _floats(value: object) -> list[float]:
    items = value if isinstance(value, list) else [value]
    return [v for v in items if type(v) is float]


@native
@settings(max_examples=400, deadline=None)
@given(ROWS)
def test_a_row_reads_back_as_json_writes_it_and_is_its_text_but_for_whole_nanoseconds(row: dict[str, Any]) -> None:
    line = encode_row(row)
    got, want = json.loads(line), json.loads(_json(row))
    assert got == want and list(got) == list(want)
    for key, value in want.items():  # float for float: 0.0 is not 0 nor -0.0, 1.5e-05 is the same float
        assert [(type(a), repr(a)) for a in (got[key] if isinstance(value, list) else [got[key]])] == [
            (type(b), repr(b)) for b in (value if isinstance(value, list) else [value])]
    if not any(_whole_ns(x) for v in row.values() for x in _floats(v)):
        assert line == _json(row)


@native
@settings(max_examples=300, deadline=None)
@given(WHOLE_NS)
def test_a_whole_number_of_nanoseconds_is_its_exact_decimal_never_longer_than_its_repr(x: float) -> None:
    text = encode_row({"t": x})[5:-1]
    assert float(text) == x and "e" not in text
    assert len(text) <= len(repr(x)) or "e" in repr(x)


@native
@pytest.mark.parametrize(("value", "text"), [
    (0.000331782, "0.000331782"), (1.5e-05, "0.000015"), (0.0, "0.0"), (-0.0, "-0.0"), (2.0, "2.0"),
    (1234.5, "1234.5"),
    (0.1 + 0.2, "0.30000000000000004"), (1e-300, "1e-300"), (-0.5, "-0.5"), (2e6, "2000000.0"),
    (1796459911.6256766, "1796459911.6256766"), (-(2**63), str(-(2**63))), (True, "true"), (None, "null"),
    ("m\u00e9\"\\\n\x01\U0001F600~\x7f\ud800", '"m\\u00e9\\"\\\\\\n\\u0001\\ud83d\\ude00~\\u007f\\ud800"'),
    ([0.1, 2, None, "x", False], '[0.1,2,null,"x",false]'), ([], "[]"),
])
def test_the_text_of_each_kind_of_value(value: object, text: str) -> None:
    assert encode_row({"k": value}) == f'{{"k":{text}}}'


class _Kind(StrEnum):
    A = "a"


@pytest.mark.parametrize("row", [
    {"x": {"nested": 1}}, {"x": (0.1, 0.2)}, {"x": [[1]]}, {"x": [{"a": 1}]},
    {"x": math.nan}, {"x": [0.1, math.inf]}, {"x": -math.inf},
    {"x": 2**64}, {"x": -(2**63) - 1},
    {"x": _Kind.A}, {1: "int key"}, {"x": b"bytes"},
], ids=lambda r: repr(r)[:40])
def test_a_row_it_does_not_write_is_written_by_json_as_it_was(row: dict[Any, Any]) -> None:
    try:
        want = _json(row)
    except TypeError:
        with pytest.raises(TypeError):
            encode_row(row)
        return
    assert encode_row(row) == want


def test_without_the_native_module_every_row_is_written_by_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sink, "_summary_json", None)
    row = {"a": 1.5e-05, "itl_s": [0.000331782] * 20}
    assert encode_row(row) == _json(row)


def test_the_writers_file_reads_back_row_for_row(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {"request_id": "r-1", "ttft_s": 0.25, "itl_s": [n / 1e9 for n in range(1000, 1064)], "error_type": None},
        {"request_id": "r-2", "nested": {"not": "flat"}}, {}]
    writer = JsonlWriter(tmp_path)
    writer.write(rows)
    writer.close()
    (path,) = writer.files
    assert [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] == rows


@native
def test_the_benchmark_prints_both_encodings_for_each_length() -> None:
    out = subprocess.run([sys.executable, "-m", "llmslo.bench.bench_summary_encoding", "--repeats", "1", "--rows",
                          "50"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "every row reads back as json's" in out.stdout
    for tokens in (0, 20, 64, 256):
        number = r"\d+(?:\.\d+)?"      # the table writes 3 significant digits: 2.0 is "2"
        assert re.search(rf"^ +{tokens} +{number} +{number} +\d+\.\d\dx$", out.stdout, re.M), out.stdout
