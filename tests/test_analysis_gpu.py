"""GPU and engine importers, the sample tables, time alignment and correlation (real vLLM/H100 data)."""

from __future__ import annotations

import functools
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

from llmslo.analysis import Store
from llmslo.analysis.gpu._correlate import aligned_frame, correlate, gpu_state_during_decode, lagged_correlation
from llmslo.analysis.gpu._samples import (
    GPU_COLUMNS,
    GpuFormatError,
    import_gpu_file,
    read_nvidia_smi_csv,
    read_nvidia_smi_dmon,
    read_vllm_engine_csv,
    store_gpu_samples,
)
from llmslo.telemetry import ConfigurationError
from llmslo.tests._rows import ok_row as row

BSC = Path(__file__).resolve().parents[2] / "shared" / "real_data" / "vllm_memory_gap_bsc" / "llama-2-13b_maxseqs128"


@pytest.fixture
def bsc() -> Path:
    if not BSC.is_dir():
        pytest.skip(f"real data not found at {BSC}")
    return BSC


def test_nvidia_smi_csv_keeps_numbers_drops_units_and_reads_throttle_flags(bsc: Path) -> None:
    f = read_nvidia_smi_csv(bsc / "metrics_gpu_device_nvidia_smi_0_server_0.csv", start_unix_s=1000.0)
    assert f.columns == list(GPU_COLUMNS)
    assert f.height == 331
    row = f.row(2, named=True)
    assert row["time_unix_s"] == pytest.approx(1002.429804576560855)
    assert row["util_gpu_pct"] == 92.0 and row["util_mem_pct"] == 81.0
    assert row["memory_used_bytes"] == 59860 * 1024 * 1024
    assert row["memory_total_bytes"] == 65247 * 1024 * 1024
    assert row["throttle_reasons"] == 0 and row["gpu"].startswith("GPU-89d32c63")


def test_nvidia_smi_timestamps_indexes_and_na_values(tmp_path: Path) -> None:
    p = tmp_path / "q.csv"
    p.write_text(
        "timestamp, index, utilization.gpu [%], memory.used [MiB], power.draw [W], temperature.gpu, "
        "clocks.sm [MHz], clocks_event_reasons.sw_power_cap\n"
        "2025/02/18 17:15:29.123, 0, 45 %, 1024 MiB, 301.50 W, 61, 1980 MHz, Active\n"
        "2025/02/18 17:15:29.123, 1, [N/A], 2048 MiB, [N/A], 60, 1980 MHz, Not Active\n"
    )
    f = read_nvidia_smi_csv(p)
    assert f["gpu"].to_list() == ["0", "1"]
    assert f["time_unix_s"][0] == pytest.approx(1739898929.123)
    assert f["power_w"].to_list() == [301.5, None]
    assert f["util_gpu_pct"].to_list() == [45.0, None]
    assert f["throttle_reasons"].to_list() == [4, 0]


def test_dmon_csv_and_printed_forms_read_alike(bsc: Path, tmp_path: Path) -> None:
    f = read_nvidia_smi_dmon(bsc / "metrics_gpu_device_nvidia_smi_dom_0_server_0.csv")
    assert f.height == 330
    first = f.row(0, named=True)
    assert (first["power_w"], first["temperature_c"], first["util_gpu_pct"], first["sm_clock_mhz"]) == (
        120.0, 46.0, 8.0, 1965.0)
    printed = tmp_path / "dmon.txt"
    printed.write_text("# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec   mclk   pclk\n"
                       "# Idx      W      C      C      %      %      %      %    MHz    MHz\n"
                       "    0    120     46     60      8      6      0      0   1593   1965\n"
                       "    1    300     70     80     99     50      0      0   1593   1755\n"
                       "    0    125     47     60     10      7      0      0   1593   1965\n")
    g = read_nvidia_smi_dmon(printed, start_unix_s=50.0, interval_s=2.0)
    assert g["gpu"].to_list() == ["0", "1", "0"]
    assert g["time_unix_s"].to_list() == [50.0, 50.0, 52.0]
    assert g["power_w"].to_list() == [120.0, 300.0, 125.0]


def test_a_malformed_row_names_its_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("time [s], utilization.gpu [%]\n0.5, 3 %\nabc, 4 %\n")
    with pytest.raises(GpuFormatError, match=r"bad.csv:3"):
        read_nvidia_smi_csv(p)
    with pytest.raises(ConfigurationError, match="unknown GPU import kind"):
        import_gpu_file(duckdb.connect(), "nvtop", p)


def test_vllm_engine_series_is_stored_long_and_counters_become_rates(bsc: Path) -> None:
    e = read_vllm_engine_csv(bsc / "metrics_engine_server_0.csv")
    assert set(e["name"].unique()) >= {"gpu_cache_usage_perc", "num_requests_waiting", "generation_tokens_total"}
    con = duckdb.connect()
    import_gpu_file(con, "vllm-engine", bsc / "metrics_engine_server_0.csv", start_unix_s=0.0)
    f = aligned_frame(con)
    assert "generation_tokens_per_s" in f.columns and "generation_tokens_total" not in f.columns
    total = e.filter(pl.col("name") == "generation_tokens_total")["value"]
    assert float(total.max()) == 637509.0  # type: ignore[arg-type]
    rate = f["generation_tokens_per_s"].drop_nulls()
    assert 1000 < float(rate.max()) < 20000  # type: ignore[arg-type]  # plausible for a 13B model on one H100


def test_real_run_kv_cache_usage_tracks_running_requests_and_power_follows_load(bsc: Path) -> None:
    con = duckdb.connect()
    import_gpu_file(con, "nvidia-smi", bsc / "metrics_gpu_device_nvidia_smi_0_server_0.csv", start_unix_s=0.0)
    import_gpu_file(con, "dmon", bsc / "metrics_gpu_device_nvidia_smi_dom_0_server_0.csv", start_unix_s=0.0)
    import_gpu_file(con, "vllm-engine", bsc / "metrics_engine_server_0.csv", start_unix_s=0.0)
    f = aligned_frame(con)
    by = {(c.signal, c.target): c for c in correlate(f)}
    kv_running = by[("gpu_cache_usage_perc", "num_requests_running")]
    assert kv_running.n > 300 and kv_running.pearson is not None and kv_running.pearson > 0.8
    kv_waiting = by[("gpu_cache_usage_perc", "num_requests_waiting")]
    assert kv_waiting.pearson is not None and 0.2 < kv_waiting.pearson < 0.7
    lag = lagged_correlation(f, "num_requests_running", "power_w", max_lag_s=30)
    assert lag is not None and lag.r_at_best > 0.8 and lag.r_at_zero is not None
    assert lag.r_at_best >= abs(lag.r_at_zero)


def test_lag_sign_says_which_series_moves_first() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=400).cumsum()
    b = np.roll(a, 5)  # b repeats a five buckets later
    f = pl.DataFrame({"t": np.arange(400, dtype=np.float64) * 2.0, "a": a, "b": b})
    lag = lagged_correlation(f, "a", "b", max_lag_s=30)
    assert lag is not None and lag.best_lag_s == 10.0 and lag.leader == "a"


def test_requests_get_the_gpu_state_of_their_decode_and_targets_are_aligned(tmp_path: Path) -> None:
    base = 1_700_000_000.0
    rows = [
        row(request_id="a", arrival_unix_s=base, ttft_s=0.5, last_token_s=4.5, e2e_s=4.6, generated_tokens=10,
            sent_tokens=10),
        row(request_id="b", arrival_unix_s=base + 10, ttft_s=0.2, last_token_s=0.3, e2e_s=0.4, generated_tokens=2,
            sent_tokens=2),
    ]
    with Store.open(tmp_path / "s.duckdb") as store:
        store.ingest_frame(pl.DataFrame(rows))
        g = pl.DataFrame({
            "time_unix_s": [base + k for k in range(12)], "gpu": ["0"] * 12, "source": ["nvml"] * 12,
            "util_gpu_pct": [float(10 * k) for k in range(12)], "util_mem_pct": [None] * 12,
            "memory_used_bytes": [1e9] * 12, "memory_total_bytes": [8e10] * 12, "power_w": [300.0] * 12,
            "temperature_c": [60.0] * 12, "sm_clock_mhz": [1980.0] * 12, "mem_clock_mhz": [2619.0] * 12,
            "throttle_reasons": [0] * 11 + [4],
        }, schema_overrides={"util_mem_pct": pl.Float64})
        assert store_gpu_samples(store.con, g) == 12
        d = gpu_state_during_decode(store.con).to_dicts()
        f = aligned_frame(store.con, bucket_s=1.0)
    assert [r["request_id"] for r in d] == ["a", "b"]
    assert d[0]["samples"] == 4 and d[0]["util_gpu_pct"] == pytest.approx(25.0)  # samples at 1, 2, 3, 4 s
    assert d[1]["samples"] == 0 and d[1]["util_gpu_pct"] == 100.0  # decode shorter than the interval: last sample
    assert d[1]["throttled"] is False
    assert f.filter(pl.col("t") == base)["ttft_s"].to_list() == [0.5]
    assert f.filter(pl.col("t") == base + 2)["in_flight"].to_list() == [1.0]
    assert f.filter(pl.col("t") == base + 11)["throttled"].to_list() == [1.0]


def test_gpu_cli_imports_the_real_run_and_prints_correlations(bsc: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from llmslo.cli._gpu import gpu_app

    db = str(tmp_path / "g.duckdb")
    runner = CliRunner()
    for kind, name in (("nvidia-smi", "metrics_gpu_device_nvidia_smi_0_server_0.csv"),
                       ("dmon", "metrics_gpu_device_nvidia_smi_dom_0_server_0.csv"),
                       ("vllm-engine", "metrics_engine_server_0.csv")):
        r = runner.invoke(gpu_app, ["import", kind, str(bsc / name), "--db", db, "--start", "0"])
        assert r.exit_code == 0, r.output
    r = runner.invoke(gpu_app, ["correlate", "--db", db, "--json"])
    assert r.exit_code == 0, r.output
    import json

    out = json.loads(r.output)
    assert out["buckets"] > 300
    assert any(c["signal"] == "gpu_cache_usage_perc" and c["target"] == "num_requests_waiting"
               for c in out["correlations"])


def _nvml_reason_now() -> str | None:
    """None when NVML can read a GPU here (``pynvml`` as imported now), else why not, as ``gpu sample`` says."""
    from llmslo.telemetry import GpuSampler

    sampler = GpuSampler(interval_s=1.0)
    if sampler.open():
        sampler.stop()
        return None
    return sampler.unavailable_reason or "NVML unavailable"


@functools.cache
def _nvml_reason() -> str | None:
    """:func:`_nvml_reason_now` of this machine, asked once."""
    return _nvml_reason_now()


def test_gpu_sample_without_nvml_says_why_exits_1_and_leaves_no_store(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from llmslo.cli._gpu import gpu_app

    if _nvml_reason() is None:
        pytest.skip("NVML reads a GPU on this machine, so gpu sample succeeds (the next tests check it)")
    db = tmp_path / "s.duckdb"
    r = CliRunner().invoke(gpu_app, ["sample", "--db", str(db), "--duration", "1s"])
    assert r.exit_code == 1
    assert f"no GPU samples: {_nvml_reason()}" in " ".join(r.stderr.split())
    assert not db.exists()


def _sample_for_two_seconds(tmp_path: Path) -> None:
    """``gpu sample --json`` succeeds, and what it says it wrote is in the store."""
    import json

    from typer.testing import CliRunner

    from llmslo.cli._gpu import gpu_app

    db = tmp_path / "s.duckdb"
    r = CliRunner().invoke(gpu_app, ["sample", "--db", str(db), "--interval", "200ms", "--duration", "2s", "--json"])
    assert r.exit_code == 0, r.output
    written = json.loads(r.stdout)["samples_written"]
    with Store.open(db, read_only=True) as store:
        sql = "SELECT count(*), count(DISTINCT gpu), min(power_w) FROM gpu_samples"
        n, gpus, power = store.con.sql(sql).fetchall()[0]
    assert written == n >= 1 and gpus >= 1
    assert power is None or power > 0


@pytest.mark.gpu
def test_gpu_sample_with_nvml_writes_samples_of_every_gpu(tmp_path: Path) -> None:
    if (reason := _nvml_reason()) is not None:
        pytest.skip(f"no GPU that NVML can read here: {reason}")
    _sample_for_two_seconds(tmp_path)


def test_gpu_sample_succeeds_wherever_nvml_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU branch on any machine: NVML answering with readings recorded on an H100."""
    import json
    import sys

    from llmslo.tests.test_telemetry_gpu import FIXTURE, ReplayNvml

    monkeypatch.setitem(sys.modules, "pynvml", ReplayNvml(list(json.loads(FIXTURE.read_text())["ticks"])))
    assert _nvml_reason_now() is None
    _sample_for_two_seconds(tmp_path)


def test_anomalies_command_prints_json_findings(tmp_path: Path) -> None:
    import json

    import typer
    from typer.testing import CliRunner

    from llmslo.cli._anomalies import anomalies_command

    rng = np.random.default_rng(0)
    n = 9000
    t = 1_700_006_400.0 + np.sort(rng.uniform(0, 3 * 3600, n))
    ttft = 0.5 * np.exp(0.4 * rng.standard_normal(n))
    ttft[t >= 1_700_006_400.0 + 7200] *= 1.5
    rows = [row(i, arrival_unix_s=float(t[i]), ttft_s=float(ttft[i]), last_token_s=float(ttft[i]) + 1.0,
                e2e_s=float(ttft[i]) + 1.1) for i in range(n)]
    db = tmp_path / "a.duckdb"
    with Store.open(db) as store:
        store.ingest_frame(pl.DataFrame(rows))
    app = typer.Typer()
    app.command()(anomalies_command)
    r = CliRunner().invoke(app, ["--db", str(db), "--baseline", "preceding:6", "--json"])
    assert r.exit_code == 0, r.output
    findings = json.loads(r.output)["findings"]
    assert [f["first_start_unix_s"] for f in findings] == [1_700_006_400.0 + 7200]
    assert findings[0]["group"] == {"model": "m1"}
    r = CliRunner().invoke(app, ["--db", str(db), "--baseline", "yesterday"])
    assert r.exit_code == 2
