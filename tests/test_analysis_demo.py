"""Tests of the synthetic demo workload (llmslo.analysis.workload._demo)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from llmslo.analysis.store._schema import polars_schema
from llmslo.analysis.workload._demo import (
    BURST_DURATION_S,
    BURST_OFFSET_S,
    ITL_ROWS,
    simulate_demo_workload,
)
from llmslo.telemetry import validate_summary

AZURE_CONV = (
    Path(__file__).resolve().parents[2] / "shared" / "real_data" / "azure" / "AzureLLMInferenceTrace_conv.csv"
)
START = 1_700_000_000.0
DRAIN_S = 120.0  # after the burst the backlog drains; keep it out of the "outside" window
SUCCESS = pl.col("finish_reason").is_in(["stop", "length"])
ADMITTED = pl.col("finish_reason") != "rejected"


@pytest.fixture(scope="module")
def synthetic() -> pl.DataFrame:
    return simulate_demo_workload(seed=1, start_unix_s=START)


@pytest.fixture(scope="module")
def azure() -> pl.DataFrame:
    if not AZURE_CONV.exists():
        pytest.skip(f"Azure conversation trace not found at {AZURE_CONV}")
    return simulate_demo_workload(AZURE_CONV, start_unix_s=START)


def _burst(frame: pl.DataFrame) -> pl.DataFrame:
    rel = pl.col("arrival_unix_s") - START
    return frame.filter((rel >= BURST_OFFSET_S) & (rel < BURST_OFFSET_S + BURST_DURATION_S))


def _outside(frame: pl.DataFrame) -> pl.DataFrame:
    rel = pl.col("arrival_unix_s") - START
    return frame.filter((rel < BURST_OFFSET_S) | (rel >= BURST_OFFSET_S + BURST_DURATION_S + DRAIN_S))


def _no_token_fraction(frame: pl.DataFrame) -> float:
    admitted = frame.filter(ADMITTED)
    return admitted["ttft_s"].null_count() / len(admitted)


def _kaplan_meier_survival(frame: pl.DataFrame, at_s: float) -> float:
    """Censoring-aware P(TTFT > at_s) over admitted requests; one without a token is censored at e2e_s."""
    admitted = frame.filter(ADMITTED)
    wait = admitted.select(pl.coalesce("ttft_s", "e2e_s")).to_series().to_numpy()
    event = admitted["ttft_s"].is_not_null().to_numpy()
    order = np.lexsort((~event, wait))  # at equal times, events before censorings
    wait, event = wait[order], event[order]
    at_risk = len(wait) - np.arange(len(wait))
    factors = np.where(event & (wait <= at_s), 1.0 - 1.0 / at_risk, 1.0)
    return float(np.prod(factors))


def _check_frame(frame: pl.DataFrame) -> None:
    assert frame.schema == polars_schema()
    assert frame["request_id"].n_unique() == len(frame)
    assert frame["arrival_unix_s"].is_sorted()
    bad = [(row["request_id"], v) for row in frame.iter_rows(named=True) if (v := validate_summary(row))]
    assert not bad, bad[:3]


def test_synthetic_frame_follows_the_contract(synthetic: pl.DataFrame) -> None:
    _check_frame(synthetic)
    assert len(synthetic) == 18_000
    assert synthetic["arrival_unix_s"].min() == START
    reasons = set(synthetic["finish_reason"].unique())
    assert {"stop", "length", "client_cancel", "rejected"} <= reasons
    assert set(synthetic["model"].unique()) == {"llama-3.1-8b", "llama-3.1-70b"}


def test_same_seed_same_frame_other_seed_other_frame() -> None:
    one = simulate_demo_workload(seed=3, max_requests=3_000)
    assert one.equals(simulate_demo_workload(seed=3, max_requests=3_000))
    assert not one.equals(simulate_demo_workload(seed=4, max_requests=3_000))
    assert len(one) == 3_000


def test_max_requests_before_the_burst_gives_a_healthy_workload() -> None:
    frame = simulate_demo_workload(seed=2, max_requests=2_000)
    _check_frame(frame)
    assert frame.filter(pl.col("finish_reason") == "rejected").is_empty()
    assert _no_token_fraction(frame) < 0.02
    assert frame.filter(SUCCESS)["ttft_s"].quantile(0.99) < 2.0


def test_azure_frame_follows_the_contract(azure: pl.DataFrame) -> None:
    _check_frame(azure)
    assert len(azure) == 19_366
    assert azure["arrival_unix_s"].min() == START


def test_azure_optional_columns_are_realistic(azure: pl.DataFrame) -> None:
    itl = azure.filter(pl.col("itl_s").is_not_null())
    assert len(itl) == ITL_ROWS
    assert (itl["itl_s"].list.len() == itl["generated_tokens"] - 1).all()
    decode = itl["last_token_s"] - itl["ttft_s"]
    assert np.allclose(itl["itl_s"].list.sum().to_numpy(), decode.to_numpy(), atol=1e-5)
    waste = azure.filter(pl.col("sent_tokens") < pl.col("generated_tokens"))
    assert len(waste) > 0
    assert (waste["stream_paused_s"] > 0).all() and (waste["stream_max_queued"] > 0).all()
    assert set(azure["version"].unique()) == {"v1", "v2"}
    with_token = azure.filter(pl.col("ttft_s").is_not_null())
    assert (with_token["client_ttft_s"] > with_token["ttft_s"]).all()
    assert set(azure.filter(pl.col("finish_reason") == "error")["error_type"].unique()) <= {
        "cuda_oom", "engine_error",
    }


def test_azure_burst_sheds_and_cancels_before_the_first_token(azure: pl.DataFrame) -> None:
    burst, outside = _burst(azure), _outside(azure)
    burst_reasons = burst["finish_reason"].value_counts()
    counts = dict(zip(burst_reasons["finish_reason"], burst_reasons["count"], strict=True))
    assert counts.get("rejected", 0) > 0
    assert counts.get("client_cancel", 0) > 0
    assert _no_token_fraction(burst) > 0.10
    assert _no_token_fraction(outside) < 0.02
    assert outside.filter(pl.col("finish_reason") == "rejected").is_empty()
    assert outside.filter(SUCCESS)["ttft_s"].quantile(0.99) < 2.0
    assert burst.filter(SUCCESS)["ttft_s"].quantile(0.5) > 2.0


def test_azure_success_only_ttft_p99_is_optimistic_in_the_burst(azure: pl.DataFrame) -> None:
    burst = _burst(azure)
    success_p99 = burst.filter(SUCCESS)["ttft_s"].quantile(0.99)
    assert success_p99 is not None
    # Censoring-aware: more than 1% of admitted requests have a TTFT above the success-only "p99".
    assert _kaplan_meier_survival(burst, success_p99) > 0.015
