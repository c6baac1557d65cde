"""Prometheus ``/metrics`` scrapes of LLM servers (vLLM, SGLang, TGI, llmslo): parse, estimate, check.

Parsing (:func:`parse_exposition`, :func:`read_scrape`) reads the Prometheus text format (0.0.4) and
OpenMetrics 1.0 (recognised by its ``# EOF`` line): ``# HELP``/``# TYPE``/``# UNIT`` metadata, samples
with labels, optional timestamps (text format: integer milliseconds; OpenMetrics: seconds) and
exemplars (``value # {labels} value [timestamp]``, accepted in both formats). A syntax error raises
:class:`ScrapeFormatError` naming the file, the line and the part of the line that is wrong.

From one scrape, :func:`analyze_scrape` gives, per histogram series:

* **bucket-estimated quantiles**: the rank ``q × count`` is located in the cumulative buckets and
  interpolated linearly inside its bucket, as PromQL's ``histogram_quantile`` does (the first bucket's
  lower edge is 0 when its upper bound is positive). They are estimates, labelled so: the true value
  lies somewhere in the same bucket. A rank that falls in the ``+Inf`` bucket is only known to be at
  least the highest finite bound (PromQL returns that bound; we say "at least").
* **the exact mean** ``sum / count``.
* **SLO attainment** for a threshold on a mapped interval (TTFT, TPOT, e2e): the fraction of
  observations ``≤ threshold``, exact only when a bucket bound equals the threshold. Otherwise the two
  bounds around it give a range, and the result says that no bound equals the threshold.

and **consistency checks** that reveal survivor bias: a TTFT count below the e2e count means requests
ended without a first token (the TTFT histogram leaves them out); requests still queued have neither;
observations above the highest finite bound make the tail unknowable from buckets; malformed
histograms (non-cumulative buckets, count ≠ ``+Inf`` bucket) are reported.

From two scrapes, :func:`compare_scrapes` gives rates over the interval: counter increase ÷ seconds,
with a reset detected when a value falls (or an OpenMetrics ``_created`` changes; the increase is then
the value after the reset), and the same quantiles, attainment and checks over the histogram increase.

:data:`KNOWN_METRICS` maps servers' metric names to our interval names (``ttft_s``, ``tpot_s``,
``itl_s``, ``e2e_s``, ``queue_s``, ``decode_s``, ``client_ttft_s``), with what one observation is and how
its definition differs from definitions.md.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from llmslo.telemetry import METRICS, LlmsloError

__all__ = [
    "DEFAULT_SCRAPE_QUANTILES",
    "KNOWN_METRICS",
    "Exemplar",
    "Finding",
    "HistogramReport",
    "HistogramSeries",
    "KnownMetric",
    "MetricFamily",
    "QuantileEstimate",
    "RateReport",
    "Sample",
    "Scrape",
    "ScrapeAnalysis",
    "ScrapeFormatError",
    "SeriesRate",
    "SloAttainment",
    "analyze_scrape",
    "bucket_quantile",
    "compare_scrapes",
    "known_metric",
    "parse_exposition",
    "read_scrape",
]

DEFAULT_SCRAPE_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
"""Quantiles estimated from every histogram series unless told otherwise."""

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
_EXACT_TOLERANCE = 1e-9


# ---------------------------------------------------------------------------------------------------
# the name table


@dataclass(frozen=True)
class KnownMetric:
    """A server's latency histogram and the interval of definitions.md it measures.

    ``name`` is the family name as exposed (without ``_bucket``); ``per`` says what one observation is
    (``request``, ``engine step``, ``streamed chunk``, ``token``); ``difference`` states how the
    server's definition differs from ours (empty when it agrees).
    """

    name: str
    server: str
    interval: str
    per: str
    difference: str


KNOWN_METRICS: tuple[KnownMetric, ...] = (
    KnownMetric("vllm:time_to_first_token_seconds", "vllm", "ttft_s", "request",
                "from the engine's arrival time of the request; requests that never produce a token are absent"),
    KnownMetric("vllm:e2e_request_latency_seconds", "vllm", "e2e_s", "request",
                "observed when the engine finishes a request"),
    KnownMetric("vllm:request_time_per_output_token_seconds", "vllm", "tpot_s", "request", ""),
    KnownMetric("vllm:inter_token_latency_seconds", "vllm", "itl_s", "engine step",
                "one observation per engine output event, not per token: a step that commits k tokens counts "
                "once with the whole gap (ours: k samples of gap / k)"),
    KnownMetric("vllm:time_per_output_token_seconds", "vllm", "itl_s", "engine step",
                "despite its name, the gap per engine output event (vLLM's older name for "
                "inter_token_latency), not a per-request TPOT"),
    KnownMetric("vllm:request_queue_time_seconds", "vllm", "queue_s", "request",
                "time in the engine's waiting queue"),
    KnownMetric("vllm:request_decode_time_seconds", "vllm", "decode_s", "request", ""),
    KnownMetric("sglang:time_to_first_token_seconds", "sglang", "ttft_s", "request",
                "from the request's creation in the tokenizer manager; aborted requests without a token are absent"),
    KnownMetric("sglang:e2e_request_latency_seconds", "sglang", "e2e_s", "request",
                "observed for every finished request, including those aborted before a first token"),
    KnownMetric("sglang:time_per_output_token_seconds", "sglang", "tpot_s", "streamed chunk",
                "(now - first token) / (tokens so far - 1), observed at every streamed chunk: a running "
                "per-request TPOT, so a long request contributes many observations (chunk-weighted, "
                "not one per request)"),
    KnownMetric("sglang:inter_token_latency_seconds", "sglang", "itl_s", "token",
                "token-weighted like ours (a chunk of k tokens counts k observations of gap / k)"),
    KnownMetric("sglang:queue_time_seconds", "sglang", "queue_s", "request", ""),
    KnownMetric("tgi_request_duration", "tgi", "e2e_s", "request",
                "successful requests only (failures only increment tgi_request_failure)"),
    KnownMetric("tgi_request_queue_duration", "tgi", "queue_s", "request", "successful requests only"),
    KnownMetric("tgi_request_mean_time_per_token_duration", "tgi", "tpot_s", "request",
                "inference time / N: includes prefill and divides by N, not decode time / (N - 1), so it "
                "is not our TPOT (closer to e2e / N); successful requests only"),
    # llmslo's own histograms, from the name catalogue (ITL is observed per token, the others per request)
    *(KnownMetric(m.name, "llmslo", m.source, "token" if m.source == "itl_s" else "request", "")
      for m in METRICS if m.type == "histogram" and m.source is not None),
)
"""Known latency histograms of LLM servers, mapped to our interval names (definitions.md)."""

_KNOWN_BY_NAME: Mapping[str, KnownMetric] = {m.name: m for m in KNOWN_METRICS}

_QUEUE_GAUGES: Mapping[str, str] = {
    "vllm:num_requests_waiting": "vllm",
    "sglang:num_queue_reqs": "sglang",
    "tgi_queue_size": "tgi",
}
_SUCCESS_COUNTERS: Mapping[str, str] = {
    "vllm:request_success_total": "vllm",
}


def known_metric(name: str) -> KnownMetric | None:
    """The :class:`KnownMetric` of a histogram family name (with or without ``_bucket``), else None."""
    return _KNOWN_BY_NAME.get(name) or _KNOWN_BY_NAME.get(name.removesuffix("_bucket"))


# ---------------------------------------------------------------------------------------------------
# parsing


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
    """An exemplar: the labels of one example observation (e.g. ``request_id``), its value and time (Unix s)."""

    labels: Mapping[str, str]
    value: float
    timestamp_s: float | None


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


# ---------------------------------------------------------------------------------------------------
# estimates


@dataclass(frozen=True)
class QuantileEstimate:
    """A quantile estimated from buckets, seconds for latency histograms.

    ``value`` is the PromQL-style linear interpolation inside the bucket holding the rank; the true
    quantile lies in [``bucket_lower``, ``bucket_upper``]. ``kind``: ``interpolated``; ``at_least``
    (the rank is in the ``+Inf`` bucket: only ``value`` = highest finite bound is known as a lower
    bound); ``none`` (no observations or an untrustworthy histogram).
    """

    q: float
    value: float | None
    bucket_lower: float | None
    bucket_upper: float | None
    kind: str

    def label(self) -> str:
        """``p99 ≈ 2.31 (bucket estimate)``, ``p99 ≥ 30 (above the highest bound)`` or ``p99 n/a``."""
        name = f"p{self.q * 100:g}"
        if self.value is None:
            return f"{name} n/a"
        if self.kind == "at_least":
            return f"{name} ≥ {self.value:g} (above the highest bucket bound)"
        return f"{name} ≈ {self.value:.4g} (bucket estimate, in ({self.bucket_lower:g}, {self.bucket_upper:g}])"


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> QuantileEstimate:
    """Estimate the ``q`` quantile (0 ≤ q ≤ 1) from cumulative ``(le, count)`` buckets sorted by ``le``.

    As PromQL's ``histogram_quantile``: rank = q × observations (the ``+Inf`` bucket); the first bucket
    whose cumulative count reaches the rank holds it; the value is interpolated linearly between that
    bucket's lower and upper bound (lower = 0 for the first bucket when its bound is positive). In the
    ``+Inf`` bucket the result is the highest finite bound, labelled ``at_least``. Raises
    ``ValueError`` for q outside [0, 1].

    >>> bucket_quantile(0.5, [(1.0, 2.0), (2.0, 6.0), (math.inf, 6.0)]).value
    1.5
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q!r}")
    if len(buckets) < 2 or not math.isinf(buckets[-1][0]):
        return QuantileEstimate(q, None, None, None, "none")
    total = buckets[-1][1]
    if not total > 0:
        return QuantileEstimate(q, None, None, None, "none")
    rank = q * total
    index = next(i for i, (_, c) in enumerate(buckets) if c >= rank)
    if index == len(buckets) - 1:
        highest = buckets[-2][0]
        return QuantileEstimate(q, highest, highest, math.inf, "at_least")
    upper, count_upto = buckets[index]
    if index == 0:
        if upper <= 0:
            return QuantileEstimate(q, upper, upper, upper, "interpolated")
        lower, count_below = 0.0, 0.0
    else:
        lower, count_below = buckets[index - 1]
    in_bucket = count_upto - count_below
    if in_bucket <= 0:
        return QuantileEstimate(q, upper, lower, upper, "interpolated")
    value = lower + (upper - lower) * (rank - count_below) / in_bucket
    return QuantileEstimate(q, value, lower, upper, "interpolated")


@dataclass(frozen=True)
class SloAttainment:
    """Fraction of observations within a threshold, from one histogram series.

    ``exact`` when a bucket bound equals ``threshold_s``: ``fraction`` = count(le = threshold) /
    observations. Otherwise ``fraction`` is None and the attainment lies in [``lower_fraction``,
    ``upper_fraction``], the fractions at the bounds just below and above (``bound_below``,
    ``bound_above``; None when there is none). ``per`` says what an observation is. When the same
    server's e2e histogram shows requests that ended without a first token (TTFT only),
    ``missing_requests`` counts them (a lower bound) and ``fraction_counting_missing`` (or the
    ``*_counting_missing`` bounds) counts them as not good.
    """

    metric: str
    labels: Labels
    interval: str
    per: str
    threshold_s: float
    observations: float
    exact: bool
    fraction: float | None
    lower_fraction: float | None
    upper_fraction: float | None
    bound_below: float | None
    bound_above: float | None
    missing_requests: float = 0.0
    fraction_counting_missing: float | None = None
    lower_counting_missing: float | None = None
    upper_counting_missing: float | None = None
    message: str = ""


@dataclass(frozen=True)
class HistogramReport:
    """One histogram series read as a distribution.

    ``interval``/``server``/``per``/``difference`` come from :data:`KNOWN_METRICS` (None when the
    name is not known). ``mean`` = sum / count (exact, same unit as the histogram). ``quantiles`` are
    bucket estimates. ``above_highest_bound`` counts observations above the highest finite bound.
    """

    metric: str
    labels: Labels
    interval: str | None
    server: str | None
    per: str | None
    difference: str | None
    count: float
    sum: float | None
    mean: float | None
    bounds: tuple[float, ...]
    quantiles: tuple[QuantileEstimate, ...]
    above_highest_bound: float
    exemplars: tuple[tuple[float, Exemplar], ...]
    problems: tuple[str, ...]


@dataclass(frozen=True)
class Finding:
    """A consistency check's result: ``check`` (a stable key), ``severity`` (``warning`` or ``info``),
    a sentence, and the numbers behind it."""

    check: str
    severity: str
    message: str
    numbers: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ScrapeAnalysis:
    """Everything one scrape says: histograms, SLO attainment, checks, counters and gauges."""

    source: str
    format: str
    timestamp_s: float | None
    servers: tuple[str, ...]
    family_types: Mapping[str, int]
    histograms: tuple[HistogramReport, ...]
    attainment: tuple[SloAttainment, ...]
    findings: tuple[Finding, ...]
    counters: tuple[tuple[str, Labels, float], ...]
    gauges: tuple[tuple[str, Labels, float], ...]
    exemplars: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (labels become objects; infinities become the string ``+Inf``)."""
        out: dict[str, Any] = _jsonable({
            "source": self.source,
            "format": self.format,
            "timestamp_s": self.timestamp_s,
            "servers": list(self.servers),
            "family_types": dict(self.family_types),
            "histograms": [_histogram_dict(h) for h in self.histograms],
            "slo_attainment": [_attainment_dict(a) for a in self.attainment],
            "findings": [_finding_dict(f) for f in self.findings],
            "counters": [{"name": n, "labels": dict(lb), "value": v} for n, lb, v in self.counters],
            "gauges": [{"name": n, "labels": dict(lb), "value": v} for n, lb, v in self.gauges],
            "exemplars": self.exemplars,
            "quantile_note": "quantiles are bucket estimates (linear interpolation inside the bucket, as "
                             "PromQL's histogram_quantile); means are exact (sum / count)",
        })
        return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        if math.isnan(value):
            return None
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _histogram_dict(h: HistogramReport) -> dict[str, Any]:
    return {
        "metric": h.metric, "labels": dict(h.labels), "interval": h.interval, "server": h.server,
        "per": h.per, "definition_difference": h.difference, "count": h.count, "sum": h.sum, "mean": h.mean,
        "bounds": list(h.bounds),
        "quantiles": {f"p{q.q * 100:g}": {"value": q.value, "kind": q.kind, "bucket_lower": q.bucket_lower,
                                          "bucket_upper": q.bucket_upper, "label": q.label()}
                      for q in h.quantiles},
        "above_highest_bound": h.above_highest_bound,
        "exemplars": [{"le": le, "labels": dict(e.labels), "value": e.value, "timestamp_s": e.timestamp_s}
                      for le, e in h.exemplars],
        "problems": list(h.problems),
    }


def _attainment_dict(a: SloAttainment) -> dict[str, Any]:
    out = {k: getattr(a, k) for k in a.__dataclass_fields__}
    out["labels"] = dict(a.labels)
    return out


def _finding_dict(f: Finding) -> dict[str, Any]:
    return {"check": f.check, "severity": f.severity, "message": f.message, "numbers": dict(f.numbers)}


def _labels_text(labels: Labels) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels)


def _series_name(name: str, labels: Labels) -> str:
    """``name{k="v",...}`` as PromQL writes a series (``name`` alone without labels)."""
    return f"{name}{{{_labels_text(labels)}}}" if labels else name


def _report(series: HistogramSeries, quantiles: Sequence[float]) -> HistogramReport:
    known = known_metric(series.family)
    total = series.total
    trusted = not series.problems
    est = tuple(
        bucket_quantile(q, series.buckets) if trusted else QuantileEstimate(q, None, None, None, "none")
        for q in quantiles
    )
    finite = [c for le, c in series.buckets if math.isfinite(le)]
    above = total - finite[-1] if finite and series.buckets and math.isinf(series.buckets[-1][0]) else 0.0
    count = series.count if series.count is not None else total
    mean = series.sum / count if series.sum is not None and count > 0 else None
    return HistogramReport(
        metric=series.family, labels=series.labels,
        interval=known.interval if known else None, server=known.server if known else None,
        per=known.per if known else None, difference=known.difference if known else None,
        count=count, sum=series.sum, mean=mean, bounds=series.finite_bounds, quantiles=est,
        above_highest_bound=above, exemplars=series.exemplars, problems=series.problems,
    )


def _fmt_count(x: float) -> str:
    return f"{x:,.0f}" if x == math.floor(x) else f"{x:,.2f}"


def _attainment(series: HistogramSeries, known: KnownMetric, threshold: float,
                missing: float) -> SloAttainment | None:
    if series.problems or not series.buckets:
        return None
    total = series.total
    if not total > 0:
        return None
    finite = [(le, c) for le, c in series.buckets if math.isfinite(le)]
    tol = _EXACT_TOLERANCE * max(1.0, abs(threshold))
    exact = next(((le, c) for le, c in finite if abs(le - threshold) <= tol), None)
    below = max(((le, c) for le, c in finite if le < threshold - tol), default=None)
    above = min(((le, c) for le, c in finite if le > threshold + tol), default=None)
    obs = f"observations (one per {known.per})"
    caveat = f"; {known.name} is not defined as our {known.interval}: {known.difference}" if (
        known.difference and known.interval == "tpot_s") else ""
    if exact is not None:
        frac = exact[1] / total
        with_missing = exact[1] / (total + missing) if missing > 0 else None
        message = (f"{frac:.2%} of {_fmt_count(total)} {obs} within {threshold:g} s "
                   f"(a bucket bound equals the threshold)")
        if with_missing is not None:
            message += (f"; {with_missing:.2%} counting the {_fmt_count(missing)} requests that ended without "
                        "a first token as not good")
        message += caveat
        return SloAttainment(known.name, series.labels, known.interval, known.per, threshold, total, True, frac,
                             frac, frac, exact[0], exact[0], missing, with_missing, with_missing, with_missing,
                             message)
    lo = below[1] / total if below is not None else 0.0
    hi = above[1] / total if above is not None else 1.0
    lo_m = lo * total / (total + missing) if missing > 0 else None
    hi_m = hi * total / (total + missing) if missing > 0 else None
    bounds = ", ".join(f"{le:g}" for le in series.finite_bounds)
    message = (f"no bucket bound equals {threshold:g} s (bounds: {bounds}): attainment over {_fmt_count(total)} "
               f"{obs} lies between {lo:.2%}"
               + (f" (≤ {below[0]:g} s)" if below is not None else "")
               + f" and {hi:.2%}" + (f" (≤ {above[0]:g} s)" if above is not None else "")
               + "; not reported as a number")
    if lo_m is not None and hi_m is not None:
        message += (f" (between {lo_m:.2%} and {hi_m:.2%} counting the {_fmt_count(missing)} requests that ended "
                    "without a first token as not good)")
    message += f". A bucket bound at {threshold:g} s would make it exact{caveat}"
    return SloAttainment(known.name, series.labels, known.interval, known.per, threshold, total, False, None,
                         lo, hi, below[0] if below else None, above[0] if above else None, missing, None, lo_m,
                         hi_m, message)


def _matching_totals(a: Sequence[HistogramSeries], b: Sequence[HistogramSeries]) -> list[tuple[Labels, float, float]]:
    """Pairs of series totals with equal label sets; the sums of all series when no label set matches."""
    by_labels = {s.labels: s.total for s in b}
    pairs = [(s.labels, s.total, by_labels[s.labels]) for s in a if s.labels in by_labels]
    if not pairs and a and b:
        pairs = [((), sum(s.total for s in a), sum(s.total for s in b))]
    return pairs


def _checks(
    series: Sequence[HistogramSeries], counters: Sequence[tuple[str, Labels, float]],
    gauges: Sequence[tuple[str, Labels, float]], *, over_interval: bool,
) -> tuple[list[Finding], dict[tuple[str, Labels], float]]:
    """Survivor-bias and sanity checks; also the requests without a first token per TTFT series."""
    findings: list[Finding] = []
    missing: dict[tuple[str, Labels], float] = {}
    scope = "over the interval" if over_interval else "since the server started"
    by_family: dict[str, list[HistogramSeries]] = {}
    for s in series:
        by_family.setdefault(s.family, []).append(s)
    for s in series:
        if s.problems:
            findings.append(Finding("malformed_histogram", "warning",
                                    f"{_series_name(s.family, s.labels)}: {'; '.join(s.problems)}; "
                                    "no quantiles are estimated from it"))
    servers = sorted({m.server for m in KNOWN_METRICS if m.name in by_family})
    for server in servers:
        fams = {m.interval: m.name for m in KNOWN_METRICS if m.server == server and m.name in by_family}
        if "ttft_s" in fams and "e2e_s" in fams:
            for labels, ttft, e2e in _matching_totals(by_family[fams["ttft_s"]], by_family[fams["e2e_s"]]):
                where = _series_name("", labels)
                if ttft < e2e:
                    gap = e2e - ttft
                    missing[(fams["ttft_s"], labels)] = gap
                    findings.append(Finding(
                        "requests_without_first_token", "warning",
                        f"{fams['e2e_s']}{where} counts {_fmt_count(e2e)} finished requests but "
                        f"{fams['ttft_s']} only {_fmt_count(ttft)} first tokens {scope}: at least {_fmt_count(gap)} "
                        "requests ended without a first token (aborted, timed out or failed). TTFT quantiles and "
                        "attainment from this histogram leave them out (survivor bias); the gap is a lower bound, "
                        "since requests in flight that already have a first token count in TTFT but not yet in e2e",
                        {"ttft_count": ttft, "e2e_count": e2e, "requests_without_first_token_at_least": gap},
                    ))
                elif ttft > e2e:
                    findings.append(Finding(
                        "first_tokens_exceed_finished", "info",
                        f"{fams['ttft_s']}{where} counts {_fmt_count(ttft - e2e)} more first tokens than "
                        f"{fams['e2e_s']} counts finished requests {scope}: requests in flight (or a restart of one "
                        "histogram); requests without a first token cannot be counted from these two",
                        {"ttft_count": ttft, "e2e_count": e2e},
                    ))
        if server == "tgi":
            findings.extend(_tgi_checks(counters, by_family.get("tgi_request_duration", []), scope))
        for name, srv in _SUCCESS_COUNTERS.items():
            if srv == server and "e2e_s" in fams:
                ok = sum(v for n, _, v in counters if n == name)
                e2e_total = sum(s.total for s in by_family[fams["e2e_s"]])
                if any(n == name for n, _, _ in counters) and e2e_total > ok:
                    findings.append(Finding(
                        "unsuccessful_requests", "info",
                        f"{fams['e2e_s']} counts {_fmt_count(e2e_total)} finished requests, {name} "
                        f"{_fmt_count(ok)} successes {scope}: {_fmt_count(e2e_total - ok)} did not succeed",
                        {"finished": e2e_total, "succeeded": ok},
                    ))
    for s in series:
        known = known_metric(s.family)
        if known is None or s.problems or not s.buckets:
            continue
        finite = [c for le, c in s.buckets if math.isfinite(le)]
        total = s.total
        above = total - finite[-1] if finite else total
        if total > 0 and above > 0:
            share = above / total
            highest = s.finite_bounds[-1] if s.finite_bounds else math.nan
            findings.append(Finding(
                "tail_above_highest_bound", "warning" if share > 0.01 else "info",
                f"{_series_name(s.family, s.labels)}: {_fmt_count(above)} of {_fmt_count(total)} observations "
                f"({share:.1%}) are above the highest bucket bound ({highest:g} s): quantiles above "
                f"p{(1 - share) * 100:.4g} are only known to be at least {highest:g} s",
                {"above": above, "total": total, "highest_bound_s": highest},
            ))
    for name, labels, value in gauges:
        if name in _QUEUE_GAUGES and value > 0:
            when = "at the later scrape" if over_interval else "at scrape time"
            findings.append(Finding(
                "queued_requests", "warning",
                f"{_series_name(name, labels)} = {_fmt_count(value)} requests waiting {when}: they have no first "
                "token yet and are in no latency histogram; under overload the histograms describe only "
                "the requests that got through",
                {"queued": value},
            ))
    return findings, missing


def _tgi_checks(counters: Sequence[tuple[str, Labels, float]], durations: Sequence[HistogramSeries],
                scope: str) -> list[Finding]:
    def total(name: str) -> float | None:
        vals = [v for n, _, v in counters if n == name]
        return sum(vals) if vals else None

    requests = total("tgi_request_count")
    success = total("tgi_request_success")
    failure = total("tgi_request_failure")
    out: list[Finding] = []
    if requests is not None and success is not None and requests > success:
        fail_text = f" ({_fmt_count(failure)} counted as failures)" if failure is not None else ""
        out.append(Finding(
            "unsuccessful_requests", "warning",
            f"tgi_request_count {_fmt_count(requests)} but tgi_request_success {_fmt_count(success)} {scope}: "
            f"{_fmt_count(requests - success)} requests did not succeed{fail_text}; TGI's latency histograms "
            "cover successful requests only (survivor bias)",
            {"requests": requests, "succeeded": success, **({"failed": failure} if failure is not None else {})},
        ))
    if requests is not None and durations:
        observed = sum(s.total for s in durations)
        if observed < requests:
            out.append(Finding(
                "requests_without_duration", "info",
                f"tgi_request_duration has {_fmt_count(observed)} observations for {_fmt_count(requests)} requests "
                f"{scope}: {_fmt_count(requests - observed)} requests have no latency (failed or in flight)",
                {"observed": observed, "requests": requests},
            ))
    return out


def _values(scrape: Scrape, kind: str) -> list[tuple[str, Labels, float]]:
    out = []
    for _, s in scrape.samples(kind):
        if kind == "counter" and s.name.endswith("_created"):
            continue
        out.append((s.name, s.labels, s.value))
    return out


def _slo_table(slo: Mapping[str, float] | None) -> dict[str, float]:
    table = dict(slo or {})
    for interval, threshold in table.items():
        if not threshold > 0 or not math.isfinite(threshold):
            raise ValueError(f"SLO threshold for {interval} must be a positive number of seconds, got {threshold!r}")
    return table


_Analysis = tuple[tuple[HistogramReport, ...], tuple[SloAttainment, ...], tuple[Finding, ...]]


def _analyze(series: Sequence[HistogramSeries], counters: Sequence[tuple[str, Labels, float]],
             gauges: Sequence[tuple[str, Labels, float]], slo: Mapping[str, float], quantiles: Sequence[float],
             *, over_interval: bool, declared_empty: frozenset[str] = frozenset()) -> _Analysis:
    for q in quantiles:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be within [0, 1], got {q!r}")
    reports = tuple(_report(s, quantiles) for s in series)
    findings, missing = _checks(series, counters, gauges, over_interval=over_interval)
    attained: list[SloAttainment] = []
    for interval, threshold in slo.items():
        matched = [s for s in series if (k := known_metric(s.family)) is not None and k.interval == interval]
        for s in matched:
            known = known_metric(s.family)
            assert known is not None
            a = _attainment(s, known, threshold, missing.get((s.family, s.labels), 0.0))
            if a is not None:
                attained.append(a)
    for interval, threshold in slo.items():
        if not any(a.interval == interval for a in attained):
            declared = sorted(m.name for m in KNOWN_METRICS if m.interval == interval and m.name in declared_empty)
            extra = (f" ({', '.join(declared)} is declared but has no series yet: no observation since start)"
                     if declared else "")
            findings.append(Finding(
                "no_histogram_for_slo", "info",
                f"no usable histogram of a known {interval} metric in this scrape{extra}: the {threshold:g} s SLO "
                f"on {interval} cannot be checked",
            ))
    return reports, tuple(attained), tuple(findings)


def _servers(scrape: Scrape) -> tuple[str, ...]:
    found: set[str] = set()
    for name in scrape.families:
        if name.startswith("vllm:"):
            found.add("vllm")
        elif name.startswith("sglang:"):
            found.add("sglang")
        elif name.startswith("tgi_"):
            found.add("tgi")
        elif name.startswith("llmslo_"):
            found.add("llmslo")
    return tuple(sorted(found))


def analyze_scrape(
    scrape: Scrape,
    *,
    slo: Mapping[str, float] | None = None,
    quantiles: Sequence[float] = DEFAULT_SCRAPE_QUANTILES,
) -> ScrapeAnalysis:
    """Read one scrape: bucket-estimated quantiles, SLO attainment and consistency checks.

    ``slo`` maps interval names (``ttft_s``, ``tpot_s``, ``e2e_s``, ...) to thresholds in seconds;
    attainment is computed on every series of a :data:`KNOWN_METRICS` histogram of that interval.
    Counts are cumulative since the server started. Raises ``ValueError`` for a threshold ≤ 0 or a
    quantile outside [0, 1].

    >>> analysis = analyze_scrape(read_scrape("metrics.txt"), slo={"ttft_s": 2.0})  # doctest: +SKIP
    """
    table = _slo_table(slo)
    series = _all_series(scrape)
    counters = _values(scrape, "counter")
    gauges = _values(scrape, "gauge")
    empty = frozenset(f.name for f in scrape.families.values() if not f.samples)
    reports, attained, findings = _analyze(series, counters, gauges, table, quantiles, over_interval=False,
                                           declared_empty=empty)
    types: dict[str, int] = {}
    for fam in scrape.families.values():
        types[fam.type] = types.get(fam.type, 0) + 1
    exemplars = sum(1 for _, s in scrape.samples() if s.exemplar is not None)
    return ScrapeAnalysis(
        source=scrape.source, format=scrape.format, timestamp_s=scrape.timestamp_s, servers=_servers(scrape),
        family_types=types, histograms=reports, attainment=attained, findings=findings,
        counters=tuple(counters), gauges=tuple(gauges), exemplars=exemplars,
    )


def _all_series(scrape: Scrape) -> list[HistogramSeries]:
    return scrape.histograms()


# ---------------------------------------------------------------------------------------------------
# two scrapes


@dataclass(frozen=True)
class SeriesRate:
    """A counter series over the interval: values before and after, increase and rate (per second).

    ``reset``: the counter restarted in between (its value fell, or its ``_created`` changed); the
    increase is then the value after. ``appeared``: absent from the first scrape (counted from 0).
    """

    name: str
    labels: Labels
    before: float | None
    after: float
    increase: float
    rate_per_s: float
    reset: bool
    appeared: bool


@dataclass(frozen=True)
class RateReport:
    """What changed between two scrapes of the same server.

    ``interval_s`` and its ``interval_basis`` (``sample timestamps`` or ``given``); counter rates; the
    histograms of the observations made during the interval (bucket increases) with their quantiles,
    SLO attainment and checks; gauges before and after; series that vanished.
    """

    before: str
    after: str
    interval_s: float
    interval_basis: str
    counters: tuple[SeriesRate, ...]
    histograms: tuple[HistogramReport, ...]
    attainment: tuple[SloAttainment, ...]
    findings: tuple[Finding, ...]
    gauges: tuple[tuple[str, Labels, float | None, float], ...]
    vanished: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        out: dict[str, Any] = _jsonable({
            "before": self.before, "after": self.after, "interval_s": self.interval_s,
            "interval_basis": self.interval_basis,
            "counters": [{"name": c.name, "labels": dict(c.labels), "before": c.before, "after": c.after,
                          "increase": c.increase, "rate_per_s": c.rate_per_s, "reset": c.reset,
                          "appeared": c.appeared} for c in self.counters],
            "histograms": [_histogram_dict(h) for h in self.histograms],
            "slo_attainment": [_attainment_dict(a) for a in self.attainment],
            "findings": [_finding_dict(f) for f in self.findings],
            "gauges": [{"name": n, "labels": dict(lb), "before": b, "after": a} for n, lb, b, a in self.gauges],
            "vanished": list(self.vanished),
            "quantile_note": "over the interval: bucket increases between the two scrapes; quantiles are bucket "
                             "estimates, means exact",
        })
        return out


def _created(scrape: Scrape) -> dict[tuple[str, Labels], float]:
    out: dict[tuple[str, Labels], float] = {}
    for fam, s in scrape.samples("counter", "histogram", "summary"):
        if s.name.endswith("_created"):
            out[(fam.name, s.labels)] = s.value
    return out


def _interval(before: Scrape, after: Scrape, interval_s: float | None) -> tuple[float, str]:
    if interval_s is not None:
        if not interval_s > 0 or not math.isfinite(interval_s):
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}")
        return float(interval_s), "given"
    missing = [s.source for s in (before, after) if s.timestamp_s is None]
    if missing:
        raise ScrapeFormatError(
            missing[0], None, None,
            "its samples carry no timestamps, so the time between the scrapes is unknown: give it "
            "(--interval-s SECONDS)")
    assert before.timestamp_s is not None and after.timestamp_s is not None
    gap = after.timestamp_s - before.timestamp_s
    if not gap > 0:
        raise ScrapeFormatError(after.source, None, None,
                                f"its latest sample timestamp is not later than {before.source}'s "
                                f"({gap:+g} s): pass the earlier scrape first")
    return gap, "sample timestamps"


def compare_scrapes(
    before: Scrape,
    after: Scrape,
    *,
    interval_s: float | None = None,
    slo: Mapping[str, float] | None = None,
    quantiles: Sequence[float] = DEFAULT_SCRAPE_QUANTILES,
) -> RateReport:
    """Rates and interval distributions between two scrapes of one server (``before`` first).

    The interval is ``interval_s`` seconds when given, else the difference of the scrapes' latest
    sample timestamps. Counter rate = increase / interval (per second); a value that fell, or a changed
    ``_created``, is a reset and the increase is the value after it. Histograms are differenced bucket
    by bucket (reset: the later histogram is taken whole) and read as in :func:`analyze_scrape`.
    Raises :class:`ScrapeFormatError` when the interval is unknown or not positive.
    """
    table = _slo_table(slo)
    span, basis = _interval(before, after, interval_s)
    created_before, created_after = _created(before), _created(after)

    def was_reset(family: str, labels: Labels) -> bool:
        a, b = created_before.get((family, labels)), created_after.get((family, labels))
        return a is not None and b is not None and a != b

    old_counters = {(n, lb): v for n, lb, v in _values(before, "counter")}
    rates: list[SeriesRate] = []
    new_keys: set[tuple[str, Labels]] = set()
    for fam, s in after.samples("counter"):
        if s.name.endswith("_created"):
            continue
        key = (s.name, s.labels)
        new_keys.add(key)
        old = old_counters.get(key)
        reset = old is not None and (s.value < old or was_reset(fam.name, s.labels))
        increase = s.value if old is None or reset else s.value - old
        rates.append(SeriesRate(s.name, s.labels, old, s.value, increase, increase / span, reset, old is None))
    old_series = {(h.family, h.labels): h for h in _all_series(before)}
    deltas: list[HistogramSeries] = []
    restarted: list[HistogramSeries] = []
    seen_hist: set[tuple[str, Labels]] = set()
    for h in _all_series(after):
        seen_hist.add((h.family, h.labels))
        delta, reset = _delta(old_series.get((h.family, h.labels)), h, was_reset(h.family, h.labels))
        deltas.append(delta)
        if reset:
            restarted.append(delta)
    counters = [(r.name, r.labels, r.increase) for r in rates]
    old_gauges = {(n, lb): v for n, lb, v in _values(before, "gauge")}
    gauges = tuple((n, lb, old_gauges.get((n, lb)), v) for n, lb, v in _values(after, "gauge"))
    later_gauges = [(n, lb, v) for n, lb, _, v in gauges]
    reports, attained, findings = _analyze(deltas, counters, later_gauges, table, quantiles, over_interval=True)
    extra = [
        Finding("counter_reset", "warning",
                f"{_series_name(r.name, r.labels)} restarted between the scrapes ({r.before:g} → {r.after:g}): "
                "its increase is taken as the value after the restart, which misses whatever was counted "
                "before the restart", {"before": r.before or 0.0, "after": r.after})
        for r in rates if r.reset
    ]
    extra += [Finding("histogram_reset", "warning",
                      f"{_series_name(h.family, h.labels)} restarted between the scrapes: the interval "
                      "distribution is the later histogram whole") for h in restarted]
    vanished = sorted({_series_name(n, lb) for n, lb in old_counters if (n, lb) not in new_keys}
                      | {_series_name(f, lb) for f, lb in old_series if (f, lb) not in seen_hist})
    return RateReport(
        before=before.source, after=after.source, interval_s=span, interval_basis=basis, counters=tuple(rates),
        histograms=tuple(reports), attainment=attained, findings=tuple(extra) + findings,
        gauges=gauges, vanished=tuple(vanished),
    )


def _delta(old: HistogramSeries | None, new: HistogramSeries, created_changed: bool) -> tuple[HistogramSeries, bool]:
    """The observations made between two states of one histogram series, and whether it restarted.

    After a restart (a bucket or the count fell, or ``_created`` changed) the later histogram is taken whole.
    """
    if old is None or new.problems or old.problems:
        return new, False
    if [le for le, _ in old.buckets] != [le for le, _ in new.buckets]:
        return HistogramSeries(new.family, new.labels, new.buckets, new.count, new.sum, new.created_s,
                               new.exemplars, ("bucket bounds changed between the scrapes",)), False
    old_buckets = dict(old.buckets)
    fell = any(c < old_buckets[le] for le, c in new.buckets) or (
        new.count is not None and old.count is not None and new.count < old.count)
    if fell or created_changed:
        return new, True
    buckets = tuple((le, c - old_buckets[le]) for le, c in new.buckets)
    count = new.count - old.count if new.count is not None and old.count is not None else None
    total_sum = new.sum - old.sum if new.sum is not None and old.sum is not None else None
    old_ex = set(old.exemplars)
    return HistogramSeries(new.family, new.labels, buckets, count, total_sum, new.created_s,
                           tuple(e for e in new.exemplars if e not in old_ex), ()), False
