"""Per-request benchmark results → request summaries: vLLM bench, LLMPerf, GenAI-Perf/AIPerf, guidellm.

Each converter reads one file and returns a frame with exactly :func:`~llmslo.analysis.store.polars_schema`
plus an :class:`ImportReport` saying what it converted and what the
file lacks. A malformed file raises :class:`ImportFormatError` naming
file, record and field, and nothing is imported.

Mapping (the same for every tool):

- These are client measurements. ``ttft_s`` = first content chunk − request sent, ``last_token_s`` = last
  content chunk − request sent, ``e2e_s`` = response complete − request sent, all seconds on the client's
  clock; ``client_ttft_s``/``client_e2e_s`` repeat them. So ``llmslo report`` computes latency, TPOT
  ``(last_token_s − ttft_s)/(N − 1)`` and goodput from the tool's own measurements, and its success-only
  quantiles reproduce the tool's: the same values, by the tool's quantile definition (linear interpolation
  for vLLM bench, LLMPerf, GenAI-Perf and AIPerf, the report's default; nearest rank for guidellm, which
  ``llmslo report --quantiles nearest-rank`` computes). Each import report says which definition the tool
  uses (:func:`~llmslo.analysis.importers._common.quantile_note`).
- Token counts are the server's ``usage`` where the file records it (GenAI-Perf's usage chunk, AIPerf's
  ``usage_completion_tokens`` / ``usage_prompt_tokens``), else the tool's own count; the import report says
  which, for how many records, and both totals where the two differ.
- Successful requests finish ``stop``, or ``length`` where the file records the request's ``max_tokens``
  (guidellm's ``request_args``, GenAI-Perf's payload) and the reply has at least that many tokens; the
  import report counts both and says where the limit is not recorded (vLLM bench, LLMPerf, AIPerf's
  records). HTTP 429 → ``rejected``/``rate_limited``; other failures → ``error`` with a bounded ``error_type``
  (``http_<code>``, ``too_few_tokens``, ``no_first_token``, ``client_timeout``, ``client_error``);
  requests the tool cancelled → ``client_cancel``.
- ``request_id`` = ``<id_prefix>#<index>``, ``id_prefix`` the first 16 hex digits of the SHA-256 of the
  file's bytes: re-importing a file (under any name) adds nothing, and two different files of the same name
  (GenAI-Perf always writes ``profile_export.json``) both land. The provenance table records ``id_prefix``.
- Requests a tool ran outside its measured window (guidellm's warm-up and cool-down, AIPerf's warm-up
  phase), which the tool leaves out of its own figures, are not imported unless
  ``ImportOptions(keep_warmup_cooldown=True)`` (``tenant_class`` ``warmup`` / ``cooldown``); the report
  says how many and why.
- ``run_duration_s``: the run's duration as the file records it (vLLM bench's ``duration``, guidellm's
  benchmark durations summed), None where it records none; ``run_duration_note`` says which.
- ``model``: ``--model``, else the name recorded in the file, else the file name. ``version`` = the
  file's recorded version or ``unknown``; ``tenant_class`` = the load level the file records
  (``request_rate=inf``, ``concurrency=10``) or ``benchmark``.
- Arrival times come from the tool's own start times. A file without them (LLMPerf) gets
  ``arrival_unix_s = 0`` on every row and ``arrivals_available = False``: the report places its rows in
  no window and takes their per-second rates from the run duration the file records (null without one),
  and the import report and the command line say so.

One module per tool (``_vllm_bench``, ``_llmperf``, ``_genai_perf``, ``_guidellm``; traces in ``_traces``),
listed in one explicit registry table; :func:`import_files` is the whole workflow of ``llmslo import``.
"""

from __future__ import annotations

from llmslo.analysis._extra import require

require("llmslo.analysis.importers", "duckdb", "pyarrow", "polars")

from llmslo.analysis.importers._registry import (
    BUILTIN_IMPORTERS,
    convert_file,
    detect_kind,
    importer_for,
    importers,
    register_importer,
)
from llmslo.analysis.importers._traces import schedule_path
from llmslo.analysis.importers._types import (
    Importer,
    ImportFormatError,
    ImportOptions,
    ImportReport,
    UnknownKindError,
)
from llmslo.analysis.importers._workflow import FileImport, ImportResult, import_files, recorded_imports

__all__ = [
    "BUILTIN_IMPORTERS",
    "FileImport",
    "ImportFormatError",
    "ImportOptions",
    "ImportReport",
    "ImportResult",
    "Importer",
    "UnknownKindError",
    "convert_file",
    "detect_kind",
    "import_files",
    "importer_for",
    "importers",
    "recorded_imports",
    "register_importer",
    "schedule_path",
]
