"""The token log (the per-token hot path): the native and the pure-Python implementation keep one contract.

Every property here runs against both; the hypothesis test drives both with the same random calls
(valid and invalid counts, speculative commits) and a scripted clock and checks they agree on everything
the terminal state reads, and that the ITL histogram equals an exact brute-force count.
"""

from __future__ import annotations

import gc
import shutil
import sys
import sysconfig
import time
import weakref
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmslo.telemetry import _tokenlog
from llmslo.telemetry._tokenlog import NativeTokenLog, PyTokenLog, TokenLogLike, token_log_factory

BOUNDS_NS = (5_000_000, 10_000_000, 20_000_000, 50_000_000, 100_000_000, 1_000_000_000)

Factory = Callable[[Callable[[], int] | None], TokenLogLike]
IMPLEMENTATIONS: list[Any] = [
    pytest.param(PyTokenLog, id="python"),
    pytest.param(NativeTokenLog, id="native",
                 marks=pytest.mark.skipif(NativeTokenLog is None, reason="the native token log is not built")),
]


def test_the_native_token_log_is_built_wherever_a_c_compiler_and_python_headers_exist() -> None:
    """The extension is optional at install; here it must exist, or the native tests would skip unseen."""
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if shutil.which("cc") is None or not headers.exists():
        pytest.skip("no C compiler or Python headers here: the pure-Python token log is the one in use")
    assert NativeTokenLog is not None, "reinstall (pip install -e .) to build telemetry/_tokenlog_c.c"


def scripted(times: list[int]) -> Callable[[], int]:
    it: Iterator[int] = iter(times)
    return lambda: next(it)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_commits_sends_and_proposals_are_counted(impl: Factory) -> None:
    log = impl(scripted([10, 20, 50, 90]))
    log.commit()
    log.send()
    log.commit(k=3, proposed=4)
    log.send(3)
    log.commit(2)
    log.commit(1, 2)
    assert len(log) == 4
    assert [log.time_ns(i) for i in range(4)] == [10, 20, 50, 90]
    assert log.generated(4) == 7 and log.generated(2) == 4 and log.generated(0) == 0
    assert log.sent == 4 and log.proposed == 6 and log.invalid == 0
    assert log.count_until(50) == 3 and log.count_until(9) == 0 and log.count_until(10**12) == 4


PREFIX = b'data: {"choices":[{"delta":{"content":"'
SUFFIX = b'"},"finish_reason":null}]}\n\n'


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_plain_chunk_commits_one_token_only_in_the_shape_expected(impl: Factory) -> None:
    """``commit_plain`` commits one token for prefix + a non-empty text without a quote + suffix, and nothing for
    anything else: another prefix or suffix, an empty text, a quote in the text (a second field), not bytes, or
    before any shape is expected and after it was withdrawn."""
    log = impl(scripted([10, 20, 30, 40]))
    assert log.commit_plain(PREFIX + b"tok" + SUFFIX) is False  # no shape expected yet
    log.expect_plain(PREFIX, SUFFIX)
    assert log.commit_plain(PREFIX + b"tok" + SUFFIX) is True
    assert log.commit_plain(PREFIX + b"a\\nb \\u00e9" + SUFFIX) is True  # escapes hold no quote
    not_plain: list[object] = [
        PREFIX + SUFFIX,  # an empty text
        PREFIX + b'x","role":"y' + SUFFIX,  # a quote: another field between
        PREFIX + b"tok" + SUFFIX.replace(b"null", b'"stop"'),  # another suffix: the finish chunk
        PREFIX.replace(b"content", b"reasoning") + b"tok" + SUFFIX,  # another prefix
        PREFIX[:-1], b"", bytearray(PREFIX + b"tok" + SUFFIX), (PREFIX + b"tok" + SUFFIX).decode(), None,
    ]
    for body in not_plain:
        assert log.commit_plain(body) is False, body
    assert len(log) == 2 and [log.time_ns(i) for i in range(2)] == [10, 20]
    log.expect_plain(None, b"")
    assert log.commit_plain(PREFIX + b"tok" + SUFFIX) is False and len(log) == 2
    with pytest.raises(TypeError):
        log.expect_plain("text", SUFFIX)  # type: ignore[arg-type]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_invalid_counts_are_ignored_and_counted_never_raised_but_a_wrong_signature_raises(impl: Factory) -> None:
    log = impl(scripted([10, 20, 30]))
    bad_calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("commit", (0,), {}), ("commit", (-2,), {}), ("commit", (1.5,), {}), ("commit", ("2",), {}),
        ("commit", (2**70,), {}), ("commit", (2**20 + 1,), {}), ("commit", (), {"k": None}),
        ("send", (-1,), {}), ("send", (0.5,), {}),
    ]
    for name, args, kwargs in bad_calls:
        getattr(log, name)(*args, **kwargs)
    for name, args, kwargs in [("commit", (), {"tokens": 2}), ("commit", (1, 0, 0), {}), ("commit", (1,), {"k": 1}),
                               ("send", (), {"count": 2}), ("send", (1, 2), {})]:
        with pytest.raises(TypeError):  # a mistake in the calling code, not bad data: raised like any Python call
            getattr(log, name)(*args, **kwargs)
    assert len(log) == 0 and log.sent == 0 and log.invalid == len(bad_calls)
    log.commit(k=2, proposed=-1)  # the commit stands, the proposal is dropped
    assert len(log) == 1 and log.generated(1) == 2 and log.proposed == 0 and log.invalid == len(bad_calls) + 1
    log.send(True)
    log.send(0)
    assert log.sent == 1


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_failing_clock_drops_the_commit_and_counts_it(impl: Factory) -> None:
    def broken() -> int:
        raise RuntimeError("clock")

    log = impl(broken)
    log.commit()
    log.commit(k=2)
    assert len(log) == 0 and log.invalid == 2


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_read_methods_refuse_prefixes_outside_the_log(impl: Factory) -> None:
    log = impl(scripted([1, 2]))
    log.commit()
    for bad in (-1, 2):
        with pytest.raises(IndexError):
            log.generated(bad)
        with pytest.raises(IndexError):
            log.gaps_s(bad)
    with pytest.raises(IndexError):
        log.time_ns(1)
    assert log.itl(1, BOUNDS_NS) is None and log.gaps_s(1) == []


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_gap_equal_to_a_bound_counts_in_that_bounds_bucket_also_per_token(impl: Factory) -> None:
    # gaps: 5 ms exactly; 10 ms over 2 tokens (5 ms each, on the bound); 10_000_001 ns over 2 (just above)
    log = impl(scripted([0, 5_000_000, 15_000_000, 25_000_001]))
    log.commit()
    log.commit()
    log.commit(k=2)
    log.commit(k=2)
    itl = log.itl(4, BOUNDS_NS)
    assert itl is not None
    counts, total_s, max_s = itl
    assert counts == [3, 2, 0, 0, 0, 0, 0]
    assert total_s == 25_000_001 / 1e9
    assert max_s == 10_000_001 / 2 / 1e9
    assert log.gaps_s(4) == [0.005, 0.005, 0.005, 10_000_001 / 2 / 1e9, 10_000_001 / 2 / 1e9]


def brute_force_itl(times: list[int], ks: list[int], m: int) -> list[int]:
    counts = [0] * (len(BOUNDS_NS) + 1)
    for i in range(1, m):
        per_token = Fraction(times[i] - times[i - 1], ks[i])
        bucket = next((j for j, b in enumerate(BOUNDS_NS) if per_token <= b), len(BOUNDS_NS))
        counts[bucket] += ks[i]
    return counts


CALL = st.one_of(
    st.tuples(st.just("commit"), st.integers(1, 4), st.integers(0, 3), st.integers(0, 120_000_000)),
    st.tuples(st.just("commit"), st.sampled_from([0, -1, 1.0, None]), st.just(0), st.just(0)),
    st.tuples(st.just("commit"), st.just(1), st.sampled_from([-3, 0.5]), st.integers(0, 3_000_000)),
    st.tuples(st.just("send"), st.sampled_from([0, 1, 1, 2, 5, -1, 1.0]), st.just(0), st.just(0)),
)


@pytest.mark.skipif(NativeTokenLog is None, reason="the native token log is not built")
@settings(max_examples=300, deadline=None)
@given(st.lists(CALL, max_size=60), st.integers(0, 2**40))
def test_both_implementations_agree_with_each_other_and_with_a_brute_force_itl(
        calls: list[tuple[str, Any, Any, int]], start_ns: int) -> None:
    clock_times: list[int] = []
    now = start_ns
    valid_times: list[int] = []
    valid_ks: list[int] = []
    for name, a, _, step in calls:
        if name == "commit" and isinstance(a, int) and a >= 1:  # an invalid count never reads the clock
            now += step
            clock_times.append(now)
            valid_times.append(now)
            valid_ks.append(a)
    assert NativeTokenLog is not None
    logs = [impl(scripted(list(clock_times))) for impl in (PyTokenLog, NativeTokenLog)]
    for log in logs:
        for name, a, b, _ in calls:
            if name == "commit":
                if isinstance(a, int) and a >= 1:
                    log.commit(a, b)
                else:
                    log.commit(k=a)
            else:
                log.send(a)
    py, native = logs
    n = len(py)
    assert len(native) == n == len(valid_times)
    assert (py.sent, py.proposed, py.invalid) == (native.sent, native.proposed, native.invalid)
    for m in range(n + 1):
        assert py.generated(m) == native.generated(m) == sum(valid_ks[:m])
        assert py.itl(m, BOUNDS_NS) == native.itl(m, BOUNDS_NS)
        assert py.gaps_s(m) == native.gaps_s(m)
        itl = native.itl(m, BOUNDS_NS)
        if m >= 2:
            assert itl is not None and itl[0] == brute_force_itl(valid_times, valid_ks, m)
        if m:
            assert py.count_until(valid_times[m - 1]) == native.count_until(valid_times[m - 1])
    assert [py.time_ns(i) for i in range(n)] == [native.time_ns(i) for i in range(n)] == valid_times


@pytest.mark.skipif(NativeTokenLog is None, reason="the native token log is not built")
def test_the_native_clock_reads_what_time_monotonic_ns_reads() -> None:
    assert NativeTokenLog is not None
    log = token_log_factory(time.monotonic_ns)()
    assert type(log) is NativeTokenLog
    before = time.monotonic_ns()
    for _ in range(1000):
        log.commit()
    after = time.monotonic_ns()
    stamps = [log.time_ns(i) for i in range(1000)]
    assert before <= stamps[0] and stamps[-1] <= after and stamps == sorted(stamps)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_log_grows_past_its_first_allocation_and_keeps_every_commit(impl: Factory) -> None:
    log = impl(scripted(list(range(0, 100_000, 10))))
    for i in range(10_000):
        log.commit(k=2 if i == 5000 else 1)
    assert len(log) == 10_000 and log.generated(10_000) == 10_001 and log.time_ns(9_999) == 99_990


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_log_in_a_reference_cycle_with_its_clock_is_collected(impl: Factory) -> None:
    class Holder:
        def __init__(self) -> None:
            self.log = impl(self.clock)

        def clock(self) -> int:
            return 1

    h = Holder()
    h.log.commit()
    ref = weakref.ref(h)
    del h
    gc.collect()
    assert ref() is None


def test_the_python_log_is_used_when_the_native_module_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tokenlog, "NativeTokenLog", None)
    assert type(token_log_factory(time.monotonic_ns)()) is PyTokenLog


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="refcounts are CPython's")
@pytest.mark.skipif(NativeTokenLog is None, reason="the native token log is not built")
def test_native_read_methods_do_not_leak_references() -> None:
    assert NativeTokenLog is not None
    log = NativeTokenLog(scripted(list(range(0, 1000, 7))))
    for i in range(100):
        log.commit(k=1 + i % 3)
    bounds = list(BOUNDS_NS)
    before = sys.getrefcount(bounds), sys.getrefcount(bounds[0])
    for _ in range(1000):
        log.itl(100, bounds)
        log.gaps_s(100)
    assert (sys.getrefcount(bounds), sys.getrefcount(bounds[0])) == before
