"""Finished requests reach the instruments in batches (``FOLD_BATCH``); whatever the batch boundaries, the
exposition must say exactly what the request summaries say.

Black-box: random requests (models, finish reasons, token counts, timings) finish under a small batch size,
then the OpenMetrics text is parsed and every histogram bucket, sum and counter is recomputed from the
summary rows; every exemplar must name a request whose value lies in its bucket, with that value.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from llmslo.telemetry import METRICS_BY_KEY, SloPolicy, Telemetry, _metrics, render_metrics, tpot_s

REQUEST = st.tuples(
    st.sampled_from(["m1", "m2", "m3"]),
    st.sampled_from(["stop", "stop", "length", "deadline", "error", "rejected", "client_cancel"]),
    st.integers(0, 5),  # tokens
    st.lists(st.integers(1, 400), min_size=8, max_size=8),  # clock steps, ms
    st.booleans(),  # scheduled
)


def run(requests: list[tuple[str, str, int, list[int], bool]], batch: int
        ) -> tuple[Telemetry, list[dict[str, object]]]:
    steps: list[int] = []
    for *_, ms, _sched in requests:
        steps.extend(ms)
    it = iter(steps)
    now = [1_000_000_000]

    def clock() -> int:
        now[0] += next(it, 1) * 1_000_000
        return now[0]

    rows: list[dict[str, object]] = []
    tel = Telemetry(clock_ns=clock, clock_unix_s=lambda: 1_700_000_000.0, sink=rows.append, version="v1",
                    policies=[SloPolicy(ttft_s=0.5, tpot_s=0.1)])
    old = _metrics.FOLD_BATCH
    _metrics.FOLD_BATCH = batch
    try:
        for i, (model, reason, tokens, _, scheduled) in enumerate(requests):
            t = tel.start(f"req-{i}", model=model, prompt_tokens=10 + i)
            if reason == "rejected":
                t.reject("queue_full")
                continue
            t.admit()
            if scheduled:
                t.schedule()
            for _ in range(tokens):
                t.commit()
                t.send()
            t.finish(reason)
        return tel, rows
    finally:
        _metrics.FOLD_BATCH = old


def exposition(tel: Telemetry) -> dict[str, Any]:
    body, _ = render_metrics(tel.registry, "application/openmetrics-text")
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


HISTOGRAMS = {"ttft": "ttft_s", "e2e": "e2e_s", "queue": "queue_s", "tpot": "tpot"}


def row_value(row: dict[str, object], column: str) -> float | None:
    if column == "tpot":
        return tpot_s(row["ttft_s"], row["last_token_s"], row["generated_tokens"])  # type: ignore[arg-type]
    v = row[column]
    return None if v is None else float(v)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.lists(REQUEST, min_size=1, max_size=40), st.integers(1, 9))
def test_batched_folds_expose_exactly_what_the_summaries_say(
        requests: list[tuple[str, str, int, list[int], bool]], batch: int) -> None:
    tel, rows = run(requests, batch)
    families = exposition(tel)
    by_id = {r["request_id"]: r for r in rows}
    for key, column in HISTOGRAMS.items():
        metric = METRICS_BY_KEY[key]
        bounds = tel.metrics.bounds_s[metric.source or key]
        family = families[metric.name]
        expected: dict[str, list[float]] = defaultdict(list)
        for r in rows:
            v = row_value(r, column)
            if v is not None:
                expected[str(r["model"])].append(v)
        seen: dict[str, dict[str, Any]] = defaultdict(dict)
        for s in family.samples:
            seen[s.labels["model"]][s.name.rsplit("_", 1)[-1] + s.labels.get("le", "")] = s
        assert set(seen) == {m for m, vs in expected.items() if vs}, key
        for model, values in expected.items():
            got = seen[model]
            assert got["count"].value == len(values)
            assert got["sum"].value == pytest.approx(math.fsum(values), rel=1e-9, abs=1e-12)
            for le in (*bounds, math.inf):
                le_s = "+Inf" if le == math.inf else repr(le)
                sample = got["bucket" + le_s]
                assert sample.value == sum(1 for v in values if v <= le), (key, model, le)
                ex = sample.exemplar
                if ex is not None:  # an example of this bucket: a request whose value lies in it
                    row = by_id[ex.labels["request_id"]]
                    v = row_value(row, column)
                    assert v is not None and v == pytest.approx(ex.value)
                    lower = max([b for b in bounds if b < le], default=-math.inf)
                    assert lower < v <= le
    tokens = families["llmslo_generated_tokens"]
    for s in tokens.samples:
        if s.name.endswith("_total"):
            model = s.labels["model"]
            assert s.value == sum(int(r["generated_tokens"]) for r in rows  # type: ignore[call-overload]
                                  if r["model"] == model)
            if s.exemplar is not None:
                assert by_id[s.exemplar.labels["request_id"]]["generated_tokens"] == s.exemplar.value
    requests_family = families["llmslo_requests"]
    for s in requests_family.samples:
        if s.name.endswith("_total"):
            assert s.value == sum(1 for r in rows if r["model"] == s.labels["model"]
                                  and r["finish_reason"] == s.labels["finish_reason"])
            if s.exemplar is not None:
                r = by_id[s.exemplar.labels["request_id"]]
                assert (r["model"], r["finish_reason"]) == (s.labels["model"], s.labels["finish_reason"])
    assert tel.metrics.value("in_flight", model="m1") == 0 and tel.metrics.value("queued", model="m2") == 0


def test_a_scrape_folds_the_requests_still_buffered() -> None:
    tel, _ = run([("m1", "stop", 3, [5] * 8, True)] * 5, batch=1000)
    assert len(tel.metrics._pending) == 5  # below the batch size: buffered
    families = exposition(tel)
    counts = [s.value for s in families["llmslo_ttft_seconds"].samples if s.name.endswith("_count")]
    assert counts == [5] and tel.metrics._pending == []


def test_a_failing_fold_never_reaches_the_server_and_is_counted_and_logged_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    tel, _ = run([], batch=2)

    def broken(*args: object) -> None:
        raise RuntimeError("fold bug")

    monkeypatch.setattr(tel.metrics, "_fold_series", broken)
    old = _metrics.FOLD_BATCH
    _metrics.FOLD_BATCH = 2
    try:
        for i in range(6):  # three folds on the request path, each failing
            t = tel.start(f"r{i}", model="m1")
            t.commit()
            assert t.finish("stop")
    finally:
        _metrics.FOLD_BATCH = old
    assert tel.metrics.value("internal_errors") == 3
    assert [r.getMessage() for r in caplog.records].count(
        "llmslo: folding 2 finished requests into the metrics failed: RuntimeError('fold bug')") == 1
