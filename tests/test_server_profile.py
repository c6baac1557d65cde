"""The engine's timing profiles: the constants in llmslo.server are the fit of the measured Splitwise runs
(``../shared/real_data/splitwise_sim/perf_model.csv``), refitted here; a malformed CSV names its row."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmslo.server import DEFAULT_PROFILE, PROFILES, EngineProfile, fit_profiles
from llmslo.telemetry import ConfigurationError

ROOT = Path(__file__).resolve().parents[1]
REAL = Path(os.environ.get("LLMSLO_REAL_DATA", ROOT.parent / "shared" / "real_data"))
CSV = REAL / "splitwise_sim" / "perf_model.csv"


@pytest.fixture(scope="module")
def refit() -> dict[str, EngineProfile]:
    if not CSV.is_file():
        pytest.skip(f"the measured runs are not here ({CSV}): the shared real_data folder is missing")
    return fit_profiles(CSV)


def test_the_profiles_are_the_fit_of_the_measured_runs(refit: dict[str, EngineProfile]) -> None:
    assert set(refit) == set(PROFILES)
    for name, fitted in refit.items():
        kept = PROFILES[name]
        for field in ("prefill_base_s", "prefill_per_token_s", "decode_base_s", "decode_per_seq_s"):
            assert getattr(kept, field) == pytest.approx(getattr(fitted, field), rel=1e-5), (name, field)
        assert (kept.model, kept.hardware, kept.tensor_parallel) == (fitted.model, fitted.hardware, 8)


def test_the_fitted_lines_follow_the_measurements_they_were_fitted_on(refit: dict[str, EngineProfile]) -> None:
    """Within the fitted range the line is close to the measured medians (prefill up to 2048 tokens)."""
    import csv
    import statistics

    prefill: dict[tuple[str, int], list[float]] = {}
    decode: dict[tuple[str, int], list[float]] = {}
    with CSV.open() as fh:
        for row in csv.DictReader(fh):
            if row["tensor_parallel"] != "8" or row["token_size"] != "128":
                continue
            name = f"{row['model']}/{row['hardware']}"
            if row["batch_size"] == "1" and int(row["prompt_size"]) <= 2048:
                prefill.setdefault((name, int(row["prompt_size"])), []).append(float(row["prompt_time"]) / 1e3)
            if row["prompt_size"] == "512":
                decode.setdefault((name, int(row["batch_size"])), []).append(float(row["token_time"]) / 1e3)
    for (name, tokens), times in prefill.items():
        assert PROFILES[name].prefill_s(tokens) == pytest.approx(statistics.median(times), rel=0.25), (name, tokens)
    for (name, batch), times in decode.items():
        assert PROFILES[name].decode_s(batch) == pytest.approx(statistics.median(times), rel=0.15), (name, batch)


def test_the_default_profile_is_llama2_70b_on_h100() -> None:
    p = PROFILES[DEFAULT_PROFILE]
    assert (p.model, p.hardware) == ("llama2-70b", "h100-80gb")
    assert p.decode_s(64) > p.decode_s(1) > 0 and p.prefill_s(2000) > p.prefill_s(10) > 0
    assert p.prefill_s(0) == 0 and p.decode_s(0) == 0


def test_a_malformed_csv_is_refused_naming_the_row_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "perf.csv"
    header = "model,hardware,prompt_size,batch_size,token_size,prompt_time,token_time,tensor_parallel\n"
    bad.write_text(header + "m,h,128,1,128,40.0,30.0,8\nm,h,256,1,128,fast,30.0,8\n")
    with pytest.raises(ConfigurationError, match=r"perf.csv: row 3, column prompt_time: not a number: 'fast'"):
        fit_profiles(bad)
    bad.write_text("model,hardware,prompt_size\nm,h,1\n")
    with pytest.raises(ConfigurationError, match="missing column"):
        fit_profiles(bad)
    bad.write_text(header + "m,h,128,1,128,40.0,30.0,8\n")
    with pytest.raises(ConfigurationError, match="m/h prefill sweep: needs rows at two or more distinct sizes"):
        fit_profiles(bad)


def test_a_negative_constant_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"EngineProfile\.prefill_base_s"):
        EngineProfile("m/h", "m", "h", 8, -0.01, 0.0001, 0.03, 0.0003)
