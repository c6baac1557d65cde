"""What an LLM server imports: the request-summary contract (standard library only).

Importing this package never loads polars, duckdb, scipy, numpy, typer or streamlit.
"""

from llmslo.telemetry._buckets import DEFAULT_BUCKETS_S
from llmslo.telemetry._errors import ConfigurationError, LlmsloError
from llmslo.telemetry._summary import (
    COLUMN_NAMES,
    COLUMNS,
    COLUMNS_BY_NAME,
    COUNT_COLUMNS,
    DECODE_SQL,
    FINISH_REASONS,
    INTERVAL_COLUMNS,
    REJECT_REASONS,
    RULES,
    SCHEMA_VERSION,
    TOKEN_COUNT_COLUMNS,
    TPOT_SQL,
    Column,
    FinishReason,
    RejectReason,
    Rule,
    Violation,
    tpot_s,
    validate_summary,
)

__all__ = [
    "COLUMNS",
    "COLUMNS_BY_NAME",
    "COLUMN_NAMES",
    "COUNT_COLUMNS",
    "DECODE_SQL",
    "DEFAULT_BUCKETS_S",
    "FINISH_REASONS",
    "INTERVAL_COLUMNS",
    "REJECT_REASONS",
    "RULES",
    "SCHEMA_VERSION",
    "TOKEN_COUNT_COLUMNS",
    "TPOT_SQL",
    "Column",
    "ConfigurationError",
    "FinishReason",
    "LlmsloError",
    "RejectReason",
    "Rule",
    "Violation",
    "tpot_s",
    "validate_summary",
]
