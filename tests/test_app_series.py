"""What the app adds to ``llmslo.analysis.report``: row selections every reader sees, what a store holds, and
ECDF curves (exact order statistics)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmslo.analysis import GoodputPolicy, ReportSpec, Store, build_report
from llmslo.analysis.importers import import_files
from llmslo.analysis.report import RowSelection, latency_ecdf, selected_rows, store_contents
from llmslo.telemetry import ConfigurationError
from llmslo.tests._app_store import HOSTILE, T0, WINDOW_S, app_rows, ingest

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return ingest(tmp_path / "s.duckdb", app_rows())


def _report(store: Store, **kw: object) -> dict[str, object]:
    return build_report(store.con, ReportSpec(GoodputPolicy(), **kw)).to_dict()  # type: ignore[arg-type]


def test_a_selection_gives_the_report_of_exactly_its_rows(db: Path, tmp_path: Path) -> None:
    rows = app_rows()
    kept = [r for r in rows if r["model"] == "m1" and T0 + 30 <= r["arrival_unix_s"] < T0 + 2.5 * WINDOW_S]
    alone = ingest(tmp_path / "alone.duckdb", kept)
    with Store.open(alone, read_only=True) as store:
        expected = _report(store, by=("version",))
    with Store.open(db, read_only=True) as store:  # read-only is enough
        selection = RowSelection(models=("m1",), from_unix_s=T0 + 30, to_unix_s=T0 + 2.5 * WINDOW_S)
        with selected_rows(store.con, selection) as picked:
            assert (picked.selected, picked.stored, picked.without_arrival) == (len(kept), len(rows), 0)
            assert _report(store, by=("version",)) == expected
        assert _report(store)["totals"]["requests"] == len(rows)  # every row again after the block


def test_a_hostile_label_is_a_parameter_and_selects_exactly_its_rows(db: Path) -> None:
    with Store.open(db, read_only=True) as store:
        for name in (*HOSTILE, "'); DROP TABLE request_summaries; --"):
            with selected_rows(store.con, RowSelection(models=(name,))) as picked:
                assert picked.selected == (5 if name in HOSTILE else 0)
        assert store.count() == len(app_rows())


def test_the_selection_is_dropped_even_when_the_block_fails(db: Path) -> None:
    with Store.open(db, read_only=True) as store:
        with pytest.raises(RuntimeError), selected_rows(store.con, RowSelection(versions=("v1",))):
            raise RuntimeError("boom")
        assert store.count() == len(app_rows())
        with (selected_rows(store.con, RowSelection(versions=("v1",))), pytest.raises(ConfigurationError),
              selected_rows(store.con, RowSelection(versions=("v2",)))):
            pass  # pragma: no cover - refused before the block


def test_a_timed_selection_leaves_out_rows_without_arrival_times(tmp_path: Path) -> None:
    db = ingest(tmp_path / "s.duckdb", app_rows()[:10])
    import_files([FIXTURES / "import" / "vllm_benchmark_serving_old.json"], "auto", db)
    with Store.open(db, read_only=True) as store:
        contents = store_contents(store.con)
        assert contents.with_arrival == 10 and contents.without_arrival > 0
        assert contents.arrival_from_unix_s == T0 and contents.arrival_to_unix_s == T0 + 9
        with selected_rows(store.con, RowSelection(placeable_only=True)) as picked:
            assert (picked.selected, picked.without_arrival) == (10, contents.without_arrival)
        with selected_rows(store.con, RowSelection(to_unix_s=T0 + 5)) as picked:  # arrival 0 is not "before"
            assert picked.selected == 5


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"models": ()}, "models"), ({"from_unix_s": float("nan")}, "from_unix_s"),
    ({"from_unix_s": 2.0, "to_unix_s": 1.0}, "from_unix_s"), ({"versions": (1,)}, "versions"),
])
def test_a_selection_that_cannot_be_made_names_its_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigurationError, match=field):
        RowSelection(**kwargs)  # type: ignore[arg-type]


def test_store_contents_lists_labels_with_counts_and_every_table(db: Path) -> None:
    with Store.open(db, read_only=True) as store:
        c = store_contents(store.con)
    models = {x.value: x.requests for x in c.labels["model"]}
    assert models == {"m1": 90, **dict.fromkeys(HOSTILE, 5)}
    assert c.labels["model"][0].value == "m1"  # most frequent first
    tables = {t.table: t.rows for t in c.tables}
    assert tables["request_summaries"] == c.requests == 105


def test_ecdf_points_are_exact_order_statistics(db: Path) -> None:
    rows = [r for r in app_rows() if r.get("ttft_s") is not None]
    with Store.open(db, read_only=True) as store:
        (curve,) = latency_ecdf(store.con, "ttft_s", points=20)
        by_model = latency_ecdf(store.con, "ttft_s", by=("model",), points=4)
        (itl,) = latency_ecdf(store.con, "itl_s", points=5)
    values = np.array([r["ttft_s"] for r in rows])
    assert curve.count == len(values) and curve.fractions[0] == 0.0 and curve.fractions[-1] == 1.0
    assert curve.values_s[0] == values.min() and curve.values_s[-1] == values.max()
    expected = np.quantile(values, curve.fractions[1:], method="inverted_cdf")
    assert list(curve.values_s[1:]) == [float(x) for x in expected]
    assert [c.keys["model"] for c in by_model] == sorted({r["model"] for r in rows})
    assert itl.count == 60 * 10 and set(itl.values_s) == {0.09}  # token-weighted: every stored gap


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"interval": "nope"}, "unknown interval"), ({"interval": "ttft_s", "by": ("tenant",)}, "unknown column"),
    ({"interval": "ttft_s", "points": 0}, "points"), ({"interval": "ttft_s", "by": ("model", "model")}, "repeated"),
])
def test_ecdf_refuses_what_it_cannot_draw(db: Path, kwargs: dict[str, object], words: str) -> None:
    with Store.open(db, read_only=True) as store, pytest.raises(ConfigurationError, match=words):
        latency_ecdf(store.con, **kwargs)  # type: ignore[arg-type]
