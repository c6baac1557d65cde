"""GPU context: sample importers (nvidia-smi CSV, dmon, vLLM engine CSV) and correlation with latency."""

from __future__ import annotations

from llmslo.analysis._extra import require

require("llmslo.analysis.gpu", "duckdb", "polars", "numpy", "scipy")

from llmslo.analysis.gpu._correlate import (
    GPU_SIGNALS,
    REQUEST_TARGETS,
    Correlation,
    LagResult,
    TimeOverlap,
    aligned_frame,
    correlate,
    gpu_state_during_decode,
    lagged_correlation,
    time_overlap,
)
from llmslo.analysis.gpu._samples import (
    ENGINE_TABLE,
    GPU_COLUMNS,
    GPU_IMPORT_KINDS,
    GPU_IMPORTS_TABLE,
    GPU_TABLE,
    GpuFormatError,
    GpuImport,
    ensure_gpu_tables,
    import_gpu_file,
    read_nvidia_smi_csv,
    read_nvidia_smi_dmon,
    read_vllm_engine_csv,
    store_engine_samples,
    store_gpu_samples,
)

__all__ = [
    "Correlation",
    "ENGINE_TABLE",
    "GPU_COLUMNS",
    "GPU_IMPORTS_TABLE",
    "GPU_IMPORT_KINDS",
    "GPU_SIGNALS",
    "GPU_TABLE",
    "GpuFormatError",
    "GpuImport",
    "LagResult",
    "REQUEST_TARGETS",
    "TimeOverlap",
    "aligned_frame",
    "correlate",
    "ensure_gpu_tables",
    "gpu_state_during_decode",
    "import_gpu_file",
    "lagged_correlation",
    "read_nvidia_smi_csv",
    "read_nvidia_smi_dmon",
    "read_vllm_engine_csv",
    "store_engine_samples",
    "store_gpu_samples",
    "time_overlap",
]
