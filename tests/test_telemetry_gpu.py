"""The NVML GPU sampler, driven by a recorded replay of NVML readings.

No GPU is available where these tests run: the NVML calls themselves (pynvml talking to a driver) are
untested here. A fake module with pynvml's names replays readings recorded from a real H100 run
(tests/fixtures/gpu/nvml_replay_h100.json); what is tested is everything around those calls: unit
conversion, gauges, the sink, failures of single queries and of the sink, the thread, and the behaviour
without NVML.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from llmslo.telemetry import METRICS_BY_KEY, ConfigurationError, GpuSampler

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "gpu" / "nvml_replay_h100.json"


class NVMLError(Exception):
    pass


class ReplayNvml:
    """pynvml-shaped: each ``nvmlDeviceGetUtilizationRates`` call of GPU 0 advances to the next tick."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2

    def __init__(self, ticks: list[dict[str, Any]], *, init_error: Exception | None = None) -> None:
        self.ticks = ticks
        self.tick = -1
        self.init_error = init_error
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.ticks[0]["gpus"])

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def _gpu(self, h: int) -> dict[str, Any]:
        return dict(self.ticks[min(self.tick, len(self.ticks) - 1)]["gpus"][h])

    def _value(self, h: int, key: str) -> Any:
        v = self._gpu(h)[key]
        if v is None:
            raise NVMLError("Not Supported")
        return v

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        if h == 0:
            self.tick += 1
        return SimpleNamespace(**self._value(h, "utilization"))

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(**self._value(h, "memory"))

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return int(self._value(h, "power_mw"))

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return int(self._value(h, "temperature_c"))

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return int(self._value(h, "clock_sm_mhz" if clock == self.NVML_CLOCK_SM else "clock_mem_mhz"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return int(self._value(h, "clocks_event_reasons"))


@pytest.fixture
def ticks() -> list[dict[str, Any]]:
    return list(json.loads(FIXTURE.read_text())["ticks"])


def test_replayed_readings_become_samples_in_store_units(ticks: list[dict[str, Any]]) -> None:
    rows: list[list[dict[str, Any]]] = []
    sampler = GpuSampler(nvml=ReplayNvml(ticks), sink=rows.append, clock=lambda: 1_700_000_000.0)
    assert sampler.open()
    first = sampler.sample_once()[0]
    g = ticks[0]["gpus"][0]
    assert first == {
        "time_unix_s": 1_700_000_000.0, "gpu": "0", "source": "nvml",
        "util_gpu_pct": float(g["utilization"]["gpu"]), "util_mem_pct": float(g["utilization"]["memory"]),
        "memory_used_bytes": float(g["memory"]["used"]), "memory_total_bytes": float(g["memory"]["total"]),
        "power_w": g["power_mw"] / 1000.0, "temperature_c": float(g["temperature_c"]),
        "sm_clock_mhz": float(g["clock_sm_mhz"]), "mem_clock_mhz": float(g["clock_mem_mhz"]),
        "throttle_reasons": 0,
    }
    assert rows == [[first]]


def test_gauges_from_the_catalogue_carry_base_units_on_the_injected_registry(ticks: list[dict[str, Any]]) -> None:
    registry = CollectorRegistry()
    sampler = GpuSampler(nvml=ReplayNvml(ticks), registry=registry)
    assert sampler.open()
    for _ in range(6):  # tick 5 carries the sw_power_cap reason
        sampler.sample_once()
    g = ticks[5]["gpus"][0]

    def value(key: str) -> float | None:
        return registry.get_sample_value(METRICS_BY_KEY[key].name, {"gpu": "0"})

    assert value("gpu_utilization") == pytest.approx(g["utilization"]["gpu"] / 100)
    assert value("gpu_memory_used") == g["memory"]["used"]
    assert value("gpu_memory_total") == g["memory"]["total"]
    assert value("gpu_power") == pytest.approx(g["power_mw"] / 1000)
    assert value("gpu_sm_clock") == pytest.approx(g["clock_sm_mhz"] * 1e6)
    assert value("gpu_throttle_reasons") == 4


def test_a_failing_query_leaves_that_value_out_and_is_counted(ticks: list[dict[str, Any]]) -> None:
    sampler = GpuSampler(nvml=ReplayNvml(ticks))
    assert sampler.open()
    samples = [sampler.sample_once()[0] for _ in range(8)]
    assert samples[6]["temperature_c"] is None  # the replay's tick 6 raises on the temperature query
    assert samples[6]["power_w"] is not None
    assert sampler.read_errors == 1


def test_a_failing_sink_is_logged_and_sampling_continues(
    ticks: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    def sink(_: list[dict[str, Any]]) -> None:
        raise OSError("store is down")

    sampler = GpuSampler(nvml=ReplayNvml(ticks), sink=sink)
    assert sampler.open()
    with caplog.at_level(logging.ERROR, logger="llmslo.telemetry.gpu"):
        for _ in range(3):
            sampler.sample_once()
    assert sampler.sink_errors == 3
    assert len([r for r in caplog.records if "sink failed" in r.getMessage()]) == 1  # rate-limited


def test_the_thread_samples_until_stopped_and_shuts_nvml_down(ticks: list[dict[str, Any]]) -> None:
    got = threading.Event()
    rows: list[list[dict[str, Any]]] = []

    def sink(batch: list[dict[str, Any]]) -> None:
        rows.append(batch)
        if len(rows) >= 3:
            got.set()

    nvml = ReplayNvml(ticks)
    sampler = GpuSampler(interval_s=0.05, nvml=nvml, sink=sink)
    assert sampler.start()
    assert sampler.running
    assert got.wait(10.0)
    sampler.stop()
    assert not sampler.running
    assert nvml.shutdowns == 1
    assert [b[0]["util_gpu_pct"] for b in rows[:3]] == [float(t["gpus"][0]["utilization"]["gpu"]) for t in ticks[:3]]


def test_without_a_gpu_start_logs_one_line_and_starts_no_thread(caplog: pytest.LogCaptureFixture) -> None:
    nvml = ReplayNvml([{"gpus": []}], init_error=NVMLError("NVML Shared Library Not Found"))
    sampler = GpuSampler(nvml=nvml)
    before = threading.active_count()
    with caplog.at_level(logging.WARNING, logger="llmslo.telemetry.gpu"):
        assert sampler.start() is False
    assert threading.active_count() == before
    assert not sampler.running
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "NVML cannot be used" in lines[0] and "Library Not Found" in lines[0]
    sampler.stop()  # harmless


def test_real_pynvml_without_a_gpu_fails_softly(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("pynvml", reason="nvidia-ml-py (extra 'gpu') is not installed")
    sampler = GpuSampler()
    with caplog.at_level(logging.WARNING, logger="llmslo.telemetry.gpu"):
        started = sampler.start()
    if started:  # pragma: no cover - only on a machine with a GPU
        sampler.stop()
        pytest.skip("a GPU is present: this test checks the no-GPU path")
    assert sampler.unavailable_reason is not None
    assert len(caplog.records) == 1


def test_an_interval_below_50_ms_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="interval_s"):
        GpuSampler(interval_s=0.01)
