"""An NVML GPU sampler for the serving process: a background thread, Prometheus gauges and a sample sink.

Every ``interval_s`` seconds, for each GPU: utilisation (%, GPU and memory controller), memory used and
total (bytes), power (W), temperature (°C), SM clock (MHz) and the clocks-event ("throttle") reason bit
mask. Each reading goes to the GPU gauges of the name catalogue (on the registry given, labelled by GPU
index) and, as one dict per GPU with the columns of the store's ``gpu_samples`` table, to ``sink``.

``pynvml`` (distribution ``nvidia-ml-py``, extra ``gpu``) is imported only when the sampler starts. Without
it, or without a GPU or driver, :meth:`GpuSampler.start` logs one line saying why, starts no thread and
returns False; it never raises. A reading that fails (one query of one GPU) leaves that value out (None)
and is counted; a failing sink is logged (rate-limited) and the sampler carries on.

Example::

    sampler = GpuSampler(interval_s=1.0, registry=my_registry, sink=rows.append)
    if sampler.start():
        ...
    sampler.stop()
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from llmslo.telemetry._errors import ConfigurationError
from llmslo.telemetry._names import (
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_USED,
    GPU_POWER,
    GPU_SM_CLOCK,
    GPU_TEMPERATURE,
    GPU_THROTTLE_REASONS,
    GPU_UTILIZATION,
    Metric,
)

__all__ = ["GpuSample", "GpuSampler", "SampleSink"]

_log = logging.getLogger("llmslo.telemetry.gpu")

GpuSample = dict[str, Any]
"""One reading of one GPU: the columns of ``gpu_samples`` (``time_unix_s``, ``gpu``, ``source`` = ``nvml``,
``util_gpu_pct``, ``util_mem_pct``, ``memory_used_bytes``, ``memory_total_bytes``, ``power_w``,
``temperature_c``, ``sm_clock_mhz``, ``mem_clock_mhz``, ``throttle_reasons``); a value NVML could not read is
None."""
SampleSink = Callable[[list[GpuSample]], None]
"""Receives the readings of all GPUs taken at one instant."""

MIN_INTERVAL_S = 0.05
_SINK_LOG_EVERY_S = 60.0


class GpuSampler:
    """Samples every GPU through NVML on a daemon thread (see the module docstring).

    ``interval_s``: seconds between samples (≥ 0.05). ``registry``: a ``prometheus_client``
    ``CollectorRegistry`` for the gauges (None: no gauges). ``sink``: called with each instant's readings.
    ``nvml``: the NVML module to use (tests pass a recorded replay; default: ``import pynvml`` at start).
    ``clock``: wall-clock seconds (default ``time.time``). Raises :class:`ConfigurationError` for a bad
    interval.
    """

    def __init__(
        self,
        *,
        interval_s: float = 1.0,
        registry: Any = None,
        sink: SampleSink | None = None,
        nvml: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not interval_s >= MIN_INTERVAL_S:
            raise ConfigurationError(f"GPU sampler interval_s must be >= {MIN_INTERVAL_S} s, got {interval_s}")
        self.interval_s = float(interval_s)
        self.sink = sink
        self.clock = clock
        self._nvml = nvml
        self._registry = registry
        self._handles: list[tuple[str, Any]] = []
        self._gauges: dict[str, Any] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.read_errors = 0
        """Readings that failed and were left out (None), since start."""
        self.sink_errors = 0
        self._last_sink_log = -_SINK_LOG_EVERY_S
        self.unavailable_reason: str | None = None

    # ---- start/stop ---------------------------------------------------------------------------------------

    def open(self) -> bool:
        """Initialise NVML and find the GPUs (no thread). False, with one logged line, when impossible."""
        try:
            nvml = self._nvml if self._nvml is not None else importlib.import_module("pynvml")
        except ImportError:
            return self._unavailable("pynvml is not installed (pip install 'llmslo[gpu]', which brings nvidia-ml-py)")
        try:
            nvml.nvmlInit()
            count = int(nvml.nvmlDeviceGetCount())
            handles = [(str(i), nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, NoPermission...
            return self._unavailable(f"NVML cannot be used ({type(exc).__name__}: {exc})")
        if not handles:
            return self._unavailable("NVML found no GPU")
        self._nvml = nvml
        self._handles = handles
        self._make_gauges()
        return True

    def _unavailable(self, why: str) -> bool:
        self.unavailable_reason = why
        _log.warning("llmslo GPU sampler not started: %s", why)
        return False

    def start(self) -> bool:
        """Open NVML and start the sampling thread; False (one log line, no thread) when NVML is unusable."""
        if self._thread is not None:
            return True
        if not self._handles and not self.open():
            return False
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="llmslo-gpu-sampler", daemon=True)
        self._thread.start()
        return True

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (waits up to ``timeout_s`` seconds) and shut NVML down."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._handles:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # shutting down: nothing useful to do with a failure
                _log.debug("nvmlShutdown failed", exc_info=True)
            self._handles = []

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    # ---- one sample ---------------------------------------------------------------------------------------

    def _read(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception:  # an unsupported query or a transient NVML error: leave the value out
            self.read_errors += 1
            return None

    def read_gpu(self, gpu: str, handle: Any, now: float) -> GpuSample:
        """One reading of one GPU (units in :data:`GpuSample`)."""
        nv = self._nvml
        util = self._read(lambda: nv.nvmlDeviceGetUtilizationRates(handle))
        mem = self._read(lambda: nv.nvmlDeviceGetMemoryInfo(handle))
        power_mw = self._read(lambda: nv.nvmlDeviceGetPowerUsage(handle))
        temp = self._read(lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU))
        sm = self._read(lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM))
        mclk = self._read(lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_MEM))
        reasons = self._read(lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(handle))
        return {
            "time_unix_s": now, "gpu": gpu, "source": "nvml",
            "util_gpu_pct": None if util is None else float(util.gpu),
            "util_mem_pct": None if util is None else float(util.memory),
            "memory_used_bytes": None if mem is None else float(mem.used),
            "memory_total_bytes": None if mem is None else float(mem.total),
            "power_w": None if power_mw is None else float(power_mw) / 1000.0,
            "temperature_c": None if temp is None else float(temp),
            "sm_clock_mhz": None if sm is None else float(sm),
            "mem_clock_mhz": None if mclk is None else float(mclk),
            "throttle_reasons": None if reasons is None else int(reasons),
        }

    def sample_once(self) -> list[GpuSample]:
        """Read every GPU now, update the gauges, hand the readings to the sink; returns them."""
        now = self.clock()
        samples = [self.read_gpu(gpu, handle, now) for gpu, handle in self._handles]
        for s in samples:
            self._update_gauges(s)
        if self.sink is not None and samples:
            try:
                self.sink(samples)
            except Exception:
                self.sink_errors += 1
                mono = time.monotonic()
                if mono - self._last_sink_log >= _SINK_LOG_EVERY_S:
                    self._last_sink_log = mono
                    _log.exception("llmslo GPU sampler: the sample sink failed (%d failures so far)", self.sink_errors)
        return samples

    # ---- gauges -------------------------------------------------------------------------------------------

    _GAUGE_FIELDS: ClassVar[tuple[tuple[Metric, str], ...]] = (
        (GPU_UTILIZATION, "util_gpu_pct"),
        (GPU_MEMORY_USED, "memory_used_bytes"),
        (GPU_MEMORY_TOTAL, "memory_total_bytes"),
        (GPU_POWER, "power_w"),
        (GPU_TEMPERATURE, "temperature_c"),
        (GPU_SM_CLOCK, "sm_clock_mhz"),
        (GPU_THROTTLE_REASONS, "throttle_reasons"),
    )

    def _make_gauges(self) -> None:
        if self._registry is None or self._gauges:
            return
        from prometheus_client import Gauge

        for metric, field in self._GAUGE_FIELDS:
            self._gauges[field] = Gauge(metric.name, metric.help, list(metric.labels), registry=self._registry)

    # Gauges carry base units: utilisation as a ratio, clocks in hertz.
    _GAUGE_SCALE: ClassVar[dict[str, float]] = {"util_gpu_pct": 0.01, "sm_clock_mhz": 1e6}

    def _update_gauges(self, s: GpuSample) -> None:
        for field, gauge in self._gauges.items():
            value = s.get(field)
            if value is not None:
                gauge.labels(gpu=s["gpu"]).set(float(value) * self._GAUGE_SCALE.get(field, 1.0))
