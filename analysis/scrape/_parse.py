"""The exposition parser: Prometheus text format 0.0.4 and OpenMetrics 1.0, into families, samples and series.

Parsing (:func:`parse_exposition`, :func:`read_scrape`) reads the Prometheus text format (0.0.4) and
OpenMetrics 1.0 (recognised by its ``# EOF`` line): ``# HELP``/``# TYPE``/``# UNIT`` metadata, samples
with labels, optional timestamps (text format: integer milliseconds; OpenMetrics: seconds; both are
held as Unix seconds) and exemplars (``value # {labels} value [timestamp]``, accepted in both formats).
A syntax error raises :class:`ScrapeFormatError` naming the file, the line and the part of the line
that is wrong.

:meth:`Scrape.histograms` groups the samples of each histogram family into :class:`HistogramSeries`
(one per label set, ``le`` excluded; bounds in the histogram's unit, seconds for latency histograms)
and says why a series cannot be trusted; :func:`parse_exposition` uses the same grouping to refuse a
bucket without a numeric ``le``.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from llmslo.telemetry import LlmsloError

__all__ = [
    "Exemplar",
    "HistogramSeries",
    "Labels",
    "MetricFamily",
    "Sample",
    "Scrape",
    "ScrapeFormatError",
    "parse_exposition",
    "read_scrape",
]

Labels = tuple[tuple[str, str], ...]
"""Label pairs sorted by name."""

_TYPES = ("counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset", "gaugehistogram")
_SUFFIXES: Mapping[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("_count", "_sum", "_created"),
    "info": ("_info",),
}
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_NUMBER = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)", re.IGNORECASE)


class ScrapeFormatError(LlmsloError, ValueError):
    """An exposition cannot be parsed (or two scrapes cannot be compared); nothing was returned.

    ``source`` is the file, ``line`` the 1-based line (None for a whole-file problem), ``part`` what
    on the line is wrong (``metric name``, ``label value``, ``value``, ``timestamp``, ``exemplar``...).
    """

    def __init__(self, source: str, line: int | None, part: str | None, message: str) -> None:
        self.source = source
        self.line = line
        self.part = part
        where = source if line is None else f"{source}: line {line}"
        if part is not None:
            where += f", {part}"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Exemplar:
    """An exemplar: the labels of one example observation (e.g. ``request_id``), its value and time (Unix s).

    Hashable like the other parsed records (two scrapes are compared by their sets of exemplars), although
    ``labels`` is a mapping: the hash is taken over its sorted pairs.
    """

    labels: Mapping[str, str]
    value: float
    timestamp_s: float | None

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.labels.items())), self.value, self.timestamp_s))


@dataclass(frozen=True)
class Sample:
    """One sample line: name, sorted label pairs, value, timestamp (Unix seconds) and exemplar."""

    name: str
    labels: Labels
    value: float
    timestamp_s: float | None
    exemplar: Exemplar | None
    line: int

    def label(self, key: str) -> str | None:
        """The value of label ``key``, or None."""
        for k, v in self.labels:
            if k == key:
                return v
        return None


@dataclass(frozen=True)
class MetricFamily:
    """The samples of one metric family, with its declared type (``untyped`` when undeclared), help and unit."""

    name: str
    type: str
    help: str | None
    unit: str | None
    samples: tuple[Sample, ...]


@dataclass(frozen=True)
class HistogramSeries:
    """One histogram series (one label set, ``le`` excluded).

    ``buckets``: (upper bound ``le``, cumulative count) sorted by bound, ``+Inf`` included when exposed.
    ``count`` and ``sum`` as exposed (None when absent); ``created_s``: OpenMetrics ``_created``, Unix s.
    ``exemplars``: (bucket bound, exemplar) pairs. ``problems``: why the series cannot be trusted.
    """

    family: str
    labels: Labels
    buckets: tuple[tuple[float, float], ...]
    count: float | None
    sum: float | None
    created_s: float | None = None
    exemplars: tuple[tuple[float, Exemplar], ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def total(self) -> float:
        """Observations: the ``+Inf`` bucket, else ``_count``, else the largest bucket."""
        if self.buckets and math.isinf(self.buckets[-1][0]):
            return self.buckets[-1][1]
        if self.count is not None:
            return self.count
        return self.buckets[-1][1] if self.buckets else 0.0

    @property
    def finite_bounds(self) -> tuple[float, ...]:
        """The finite ``le`` bounds, seconds for latency histograms."""
        return tuple(le for le, _ in self.buckets if math.isfinite(le))


@dataclass(frozen=True)
class Scrape:
    """A parsed exposition: its families in file order, its format and its time.

    ``format`` is ``prometheus-text`` or ``openmetrics``; ``timestamp_s`` is the latest sample
    timestamp (Unix seconds), None when no sample carries one.
    """

    source: str
    format: str
    families: Mapping[str, MetricFamily]
    timestamp_s: float | None

    def samples(self, *types: str) -> list[tuple[MetricFamily, Sample]]:
        """Every (family, sample) pair, of the given family types only when some are given."""
        return [(f, s) for f in self.families.values() if not types or f.type in types for s in f.samples]

    def histograms(self) -> list[HistogramSeries]:
        """Every series of every histogram (and gauge histogram) family, in file order."""
        out: list[HistogramSeries] = []
        for fam in self.families.values():
            if fam.type in ("histogram", "gaugehistogram"):
                out.extend(_histogram_series(fam, self.source))
        return out


def _unescape(text: str, source: str, line: int, part: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            if i + 1 >= len(text):
                raise ScrapeFormatError(source, line, part, "a backslash ends the text")
            nxt = text[i + 1]
            out.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, "\\" + nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _parse_labels(text: str, pos: int, source: str, line: int) -> tuple[dict[str, str], int]:
    """Parse ``{name="value",...}`` starting at ``text[pos] == '{'``; return labels and the position after ``}``."""
    labels: dict[str, str] = {}
    pos += 1
    n = len(text)
    while True:
        while pos < n and text[pos] in " \t":
            pos += 1
        if pos < n and text[pos] == "}":
            return labels, pos + 1
        match = _LABEL_NAME.match(text, pos)
        if match is None:
            raise ScrapeFormatError(source, line, "label name",
                                    f"expected a label name or '}}' at column {pos + 1}")
        name = match.group(0)
        pos = match.end()
        while pos < n and text[pos] in " \t":
            pos += 1
        if pos >= n or text[pos] != "=":
            raise ScrapeFormatError(source, line, f"label {name!r}", f"expected '=' at column {pos + 1}")
        pos += 1
        while pos < n and text[pos] in " \t":
            pos += 1
        if pos >= n or text[pos] != '"':
            raise ScrapeFormatError(source, line, f"label {name!r}",
                                    f"expected a quoted label value at column {pos + 1}")
        start = pos + 1
        pos = start
        while pos < n and text[pos] != '"':
            pos += 2 if text[pos] == "\\" else 1
        if pos >= n:
            raise ScrapeFormatError(source, line, f"label {name!r}", "the label value has no closing quote")
        if name in labels:
            raise ScrapeFormatError(source, line, f"label {name!r}", "the label appears twice")
        labels[name] = _unescape(text[start:pos], source, line, f"label {name!r}")
        pos += 1
        while pos < n and text[pos] in " \t":
            pos += 1
        if pos < n and text[pos] == ",":
            pos += 1
        elif pos < n and text[pos] == "}":
            continue
        else:
            raise ScrapeFormatError(source, line, "labels", f"expected ',' or '}}' at column {pos + 1}")


def _number(token: str, source: str, line: int, part: str) -> float:
    if _NUMBER.fullmatch(token) is None:
        raise ScrapeFormatError(source, line, part, f"{token!r} is not a number")
    return float(token)


def _parse_exemplar(text: str, source: str, line: int, openmetrics: bool) -> Exemplar:
    text = text.strip()
    if not text.startswith("{"):
        raise ScrapeFormatError(source, line, "exemplar", "expected '{' after '#'")
    labels, pos = _parse_labels(text, 0, source, line)
    tokens = text[pos:].split()
    if not 1 <= len(tokens) <= 2:
        raise ScrapeFormatError(source, line, "exemplar", "expected a value and an optional timestamp")
    value = _number(tokens[0], source, line, "exemplar value")
    ts = _number(tokens[1], source, line, "exemplar timestamp") if len(tokens) == 2 else None
    if ts is not None and not openmetrics and ts > 1e11:  # milliseconds in a text-format file
        ts /= 1e3
    return Exemplar(labels=labels, value=value, timestamp_s=ts)


def _parse_sample(text: str, source: str, line: int, openmetrics: bool) -> Sample:
    match = _NAME.match(text)
    if match is None:
        raise ScrapeFormatError(source, line, "metric name", f"{text.split()[0]!r} is not a metric name")
    name = match.group(0)
    pos = match.end()
    labels: dict[str, str] = {}
    if pos < len(text) and text[pos] == "{":
        labels, pos = _parse_labels(text, pos, source, line)
    rest = text[pos:]
    if rest and rest[0] not in " \t":
        raise ScrapeFormatError(source, line, "metric name", f"unexpected {rest[0]!r} after {name!r}")
    body, hash_, exemplar_text = rest.partition("#")
    tokens = body.split()
    if not tokens:
        raise ScrapeFormatError(source, line, "value", f"sample {name!r} has no value")
    if len(tokens) > 2:
        raise ScrapeFormatError(source, line, "timestamp", f"unexpected {' '.join(tokens[2:])!r} after the value")
    value = _number(tokens[0], source, line, "value")
    timestamp = None
    if len(tokens) == 2:
        if openmetrics:
            timestamp = _number(tokens[1], source, line, "timestamp")
        else:
            if re.fullmatch(r"-?\d+", tokens[1]) is None:
                raise ScrapeFormatError(source, line, "timestamp",
                                        f"{tokens[1]!r} is not an integer number of milliseconds")
            timestamp = int(tokens[1]) / 1e3
    exemplar = _parse_exemplar(exemplar_text, source, line, openmetrics) if hash_ else None
    return Sample(name=name, labels=tuple(sorted(labels.items())), value=value, timestamp_s=timestamp,
                  exemplar=exemplar, line=line)


def _family_of(name: str, types: Mapping[str, str]) -> str:
    if name in types:
        return name
    for suffix in ("_bucket", "_count", "_sum", "_created", "_total", "_gcount", "_gsum", "_info"):
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            if base in types and suffix in _SUFFIXES.get(types[base], ()):
                return base
    return name


def parse_exposition(text: str, source: str = "<text>") -> Scrape:
    """Parse a Prometheus text or OpenMetrics exposition.

    ``source`` names the input in error messages. Raises :class:`ScrapeFormatError` at the first
    malformed line (bad name, label, value or timestamp, unknown type, metadata after samples of the
    same family in OpenMetrics, a duplicate sample, text after ``# EOF``) or when there is no sample.
    """
    lines = text.split("\n")
    openmetrics = any(raw.rstrip("\r") == "# EOF" for raw in lines)
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    units: dict[str, str] = {}
    order: list[str] = []
    members: dict[str, list[Sample]] = {}
    seen: dict[tuple[str, Labels], int] = {}
    ended = False
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r")
        if ended:
            if line.strip():
                raise ScrapeFormatError(source, number, None, "text after '# EOF'")
            continue
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line[1:].strip().split(None, 2)
            if parts == ["EOF"]:
                ended = True
                continue
            if len(parts) >= 2 and parts[0] in ("HELP", "TYPE", "UNIT"):
                kind, fam = parts[0], parts[1]
                if _NAME.fullmatch(fam) is None:
                    raise ScrapeFormatError(source, number, "metric name", f"{fam!r} is not a metric name")
                value = parts[2] if len(parts) == 3 else ""
                if kind == "TYPE":
                    if value not in _TYPES:
                        raise ScrapeFormatError(source, number, "type",
                                                f"unknown metric type {value!r} (expected one of {', '.join(_TYPES)})")
                    if fam in types:
                        raise ScrapeFormatError(source, number, "type", f"{fam!r} is typed twice")
                    if fam in members:
                        raise ScrapeFormatError(source, number, "type",
                                                f"the TYPE of {fam!r} comes after its samples")
                    types[fam] = value
                elif kind == "HELP":
                    helps[fam] = _unescape(value, source, number, "help text")
                else:
                    units[fam] = value
                if fam not in order:
                    order.append(fam)
            continue
        sample = _parse_sample(line.strip(), source, number, openmetrics)
        key = (sample.name, sample.labels)
        if key in seen:
            raise ScrapeFormatError(source, number, "sample",
                                    f"duplicate sample {sample.name} (first on line {seen[key]})")
        seen[key] = number
        fam = _family_of(sample.name, types)
        if fam not in order:
            order.append(fam)
        members.setdefault(fam, []).append(sample)
    if not seen:
        raise ScrapeFormatError(source, None, None, "no metric samples (is this a /metrics exposition?)")
    families = {
        fam: MetricFamily(name=fam, type=types.get(fam, "untyped"), help=helps.get(fam), unit=units.get(fam),
                          samples=tuple(members.get(fam, ())))
        for fam in order
    }
    for family in families.values():
        if family.type in ("histogram", "gaugehistogram"):
            _histogram_series(family, source)  # raises on a bucket without a numeric 'le'
    stamps = [s.timestamp_s for ss in members.values() for s in ss if s.timestamp_s is not None]
    return Scrape(source=source, format="openmetrics" if openmetrics else "prometheus-text", families=families,
                  timestamp_s=max(stamps) if stamps else None)


def read_scrape(path: str | Path) -> Scrape:
    """Read and parse an exposition file (UTF-8). Raises :class:`ScrapeFormatError`."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ScrapeFormatError(source, None, None, "no such file") from None
    except IsADirectoryError:
        raise ScrapeFormatError(source, None, None, "is a directory, not an exposition file") from None
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise ScrapeFormatError(source, line, None, "not UTF-8 text") from None
    return parse_exposition(text, source)


def _bad_histogram(source: str, sample: Sample, message: str) -> NoReturn:
    raise ScrapeFormatError(source, sample.line, "le", message)


_SERIES_FIELDS: Mapping[str, str] = {
    "_count": "count", "_sum": "sum", "_created": "created", "_gcount": "count", "_gsum": "sum",
}


def _histogram_series(fam: MetricFamily, source: str = "") -> list[HistogramSeries]:
    groups: dict[Labels, dict[str, Any]] = {}
    for s in fam.samples:
        suffix = s.name[len(fam.name):]
        if suffix == "_bucket":
            le_text = s.label("le")
            if le_text is None:
                _bad_histogram(source, s, f"bucket of {fam.name} has no 'le' label")
            if _NUMBER.fullmatch(le_text.strip()) is None:
                _bad_histogram(source, s, f"bucket bound {le_text!r} is not a number")
            key = tuple(p for p in s.labels if p[0] != "le")
            g = groups.setdefault(key, {"buckets": [], "exemplars": []})
            le = float(le_text)
            g["buckets"].append((le, s.value))
            if s.exemplar is not None:
                g["exemplars"].append((le, s.exemplar))
        elif suffix in _SERIES_FIELDS:
            g = groups.setdefault(s.labels, {"buckets": [], "exemplars": []})
            g[_SERIES_FIELDS[suffix]] = s.value
    out: list[HistogramSeries] = []
    for labels, g in groups.items():
        buckets = sorted(g["buckets"])
        problems: list[str] = []
        if not buckets:
            problems.append("no buckets")
        elif not math.isinf(buckets[-1][0]):
            problems.append("no +Inf bucket")
        if len({le for le, _ in buckets}) < len(buckets):
            problems.append("a bucket bound appears twice (e.g. le=\"1\" and le=\"1.0\")")
        if any(b[1] < a[1] for a, b in itertools.pairwise(buckets)):
            problems.append("bucket counts are not cumulative (a larger bound has a smaller count)")
        if any(c < 0 or math.isnan(c) for _, c in buckets):
            problems.append("a bucket count is negative or NaN")
        count = g.get("count")
        if count is not None and buckets and math.isinf(buckets[-1][0]) and count != buckets[-1][1]:
            problems.append(f"_count {count:g} differs from the +Inf bucket {buckets[-1][1]:g}")
        out.append(HistogramSeries(
            family=fam.name, labels=labels, buckets=tuple(buckets), count=count, sum=g.get("sum"),
            created_s=g.get("created"), exemplars=tuple(g["exemplars"]), problems=tuple(problems),
        ))
    return out
