"""Label policy: every label value comes from a declared set; anything else is exposed as ``other``.

Request ids, prompts, user ids and other free text can never be labels: naming one raises at
construction. Request ids travel in exemplars and trace attributes instead.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from llmslo.telemetry._errors import ConfigurationError
from llmslo.telemetry._names import LABELS, OVERFLOW_VALUE

FORBIDDEN_LABELS: frozenset[str] = frozenset({
    "request_id", "trace_id", "span_id", "session_id", "conversation_id", "user", "user_id", "username",
    "email", "tenant_id", "api_key", "prompt", "prompt_text", "input", "output", "completion", "text",
    "message", "content", "url", "path", "ip",
})
"""Names that carry unbounded or personal values; a label policy that names one raises."""


class LabelPolicy:
    """Which values each label may take on the exposed metrics.

    ``values`` declares, per label name, the values to expose (any other becomes ``other``); a label not
    declared takes the catalogue's closed set, or for an open label the first ``max_values[label]``
    distinct values seen (default: the catalogue's bound), then ``other``.

    Raises :class:`ConfigurationError` naming the field for a forbidden or unknown label, a value outside
    a closed label's set, or a bound below 1.

    Example::

        LabelPolicy(values={"model": ["llama-3-8b"], "tenant_class": ["interactive", "batch"]})
    """

    def __init__(self, values: Mapping[str, Sequence[str]] | None = None,
                 max_values: Mapping[str, int] | None = None) -> None:
        self._declared: dict[str, frozenset[str]] = {}
        self._max: dict[str, int] = {}
        for field_name, mapping in (("values", values or {}), ("max_values", max_values or {})):
            for name in mapping:
                _check_name(f"LabelPolicy.{field_name}", name)
        for name, vals in (values or {}).items():
            if isinstance(vals, str):
                raise ConfigurationError(f"LabelPolicy.values[{name!r}]: give a list of values, not a string")
            declared = frozenset(vals)
            bad = [v for v in declared if not isinstance(v, str) or not v]
            if bad:
                raise ConfigurationError(f"LabelPolicy.values[{name!r}]: values must be non-empty strings")
            closed = LABELS[name].values
            if closed is not None and not declared <= set(closed):
                extra = ", ".join(sorted(declared - set(closed)))
                raise ConfigurationError(
                    f"LabelPolicy.values[{name!r}]: {extra} not in the closed set {', '.join(closed)}")
            self._declared[name] = declared
        for name, bound in (max_values or {}).items():
            if not isinstance(bound, int) or isinstance(bound, bool) or bound < 1:
                raise ConfigurationError(f"LabelPolicy.max_values[{name!r}]: must be an integer >= 1, got {bound!r}")
            self._max[name] = bound
        self._seen: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def bound(self, name: str, allowed: Sequence[str] | None = None) -> int:
        """The most distinct values ``name`` can expose, ``other`` included."""
        if name in self._declared:
            return len(self._declared[name]) + 1
        if allowed is not None:
            return len(allowed) + 1
        return self._max.get(name, LABELS[name].max_values) + 1

    def resolve(self, name: str, value: object, allowed: Sequence[str] | frozenset[str] | None = None) -> str:
        """The exposed value of label ``name`` for ``value`` (``other`` when not allowed or over the bound).

        ``allowed`` narrows a closed label on one metric. Never raises for a value.
        """
        if not isinstance(value, str):
            return OVERFLOW_VALUE
        declared = self._declared.get(name)
        if declared is not None:
            return value if value in declared else OVERFLOW_VALUE
        if allowed is not None:
            return value if value in allowed else OVERFLOW_VALUE
        closed = LABELS[name].values
        if closed is not None:
            return value if value in closed else OVERFLOW_VALUE
        seen = self._seen.get(name)
        if seen is not None and value in seen:
            return value
        with self._lock:
            seen = self._seen.setdefault(name, set())
            if value in seen:
                return value
            if value == OVERFLOW_VALUE or len(seen) >= self._max.get(name, LABELS[name].max_values):
                return OVERFLOW_VALUE
            seen.add(value)
            return value


def _check_name(field_name: str, name: object) -> None:
    if not isinstance(name, str):
        raise ConfigurationError(f"{field_name}: label names are strings, got {name!r}")
    if name in FORBIDDEN_LABELS or name.endswith("_id"):
        raise ConfigurationError(
            f"{field_name}: {name!r} can never be a metric label (unbounded or personal values); "
            "request ids go to exemplars and trace attributes")
    if name not in LABELS:
        raise ConfigurationError(f"{field_name}: unknown label {name!r}; labels: {', '.join(sorted(LABELS))}")
