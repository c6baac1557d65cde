"""The token log of one request: commit times, token counts, and the token-weighted ITL they give.

This is the per-token hot path: an engine calls ``commit()`` once per step of every request and a transport
calls ``send()`` once per chunk, so its cost multiplies by every token served. Two implementations keep one
contract (the tests run both on the same inputs):

* a native one (``_tokenlog_c.c``, built at install when a C compiler is present): a commit reads
  ``CLOCK_MONOTONIC`` (what ``time.monotonic_ns`` reads on Linux) and stores it in a growing array, the ITL
  histogram is one pass in C at the terminal state;
* :class:`PyTokenLog`, pure Python, used when the native module could not be built or an injected clock is
  not ``time.monotonic_ns``.

A streamed reply's per-chunk shortcut lives here too, as one call: ``expect_plain(prefix, suffix)`` gives the
bytes around the text of the stream's plain content chunks (``_reply_observer.py`` learns them), and
``commit_plain(body)`` commits one token when ``body`` is ``prefix + text + suffix`` with a non-empty text that
holds no quote, and says whether it did.

Both never raise on data: a count that is not a non-negative integer (``k`` must be at least 1 and at most
2**20), an
injected clock that fails, or memory that runs out is counted in ``invalid`` and the call does nothing else
(an invalid ``proposed`` leaves the commit itself recorded). A call that does not match the signature (an
unknown keyword, too many arguments) raises ``TypeError`` in both, as any Python call would.

A gap ``g`` (ns) followed by a commit of ``k`` tokens gives ``k`` samples of ``g / k`` (definitions.md,
``itl_s``); a sample counts in the bucket of the first bound ``b`` (ns) with ``g / k <= b``, decided in exact
integer arithmetic (``ceil(g / k) <= b``).
"""

from __future__ import annotations

import functools
import sys
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from itertools import islice
from operator import sub
from typing import Protocol

ItlCounts = tuple[list[int], float, float]


class TokenLogLike(Protocol):
    """What the request tracker needs from a token log (both implementations)."""

    sent: int
    proposed: int
    invalid: int

    def commit(self, k: int = 1, proposed: int = 0) -> None: ...

    def send(self, n: int = 1) -> None: ...

    def expect_plain(self, prefix: bytes | None, suffix: bytes, /) -> None: ...

    def commit_plain(self, body: object, /) -> bool: ...

    def __len__(self) -> int: ...

    def count_until(self, until_ns: int) -> int: ...

    def time_ns(self, i: int) -> int: ...

    def generated(self, m: int) -> int: ...

    def itl(self, m: int, bounds_ns: Sequence[int]) -> ItlCounts | None: ...

    def gaps_s(self, m: int) -> list[float]: ...


_COUNT_MAX = 2**63 - 1  # the native log's counters are 64-bit
# The most tokens one commit may carry: far above any reply (2**20, about a million), and it bounds what one
# bad count can cost (the token-weighted gaps hold k samples per commit).
_K_MAX = 2**20
# The common calls, commit() and send(), are recognised by identity: CPython caches small ints, so a literal
# 1 or 0 is always this object, and an equal value that is not (1.0, True, another runtime) takes the path
# that validates it. Measured here: about twice as cheap as checking the type and the value.
_ONE = 1
_ZERO = 0


def _count(value: object) -> int:
    """``value`` when it is a non-negative int (bool included, as in C) that fits 64 bits, else -1."""
    return value if isinstance(value, int) and 0 <= value <= _COUNT_MAX else -1


class PyTokenLog:
    """The pure-Python token log. ``clock_ns`` returns monotonic nanoseconds (``time.monotonic_ns`` if None).

    Read methods take ``m``, a number of leading commits (``0 <= m <= len(log)``).
    """

    __slots__ = ("_append", "_clock", "_multi", "_plen", "_prefix_bytes", "_slen", "_suffix", "_times", "invalid",
                 "proposed", "sent")

    def __init__(self, clock_ns: Callable[[], int] | None = None) -> None:
        self._clock = clock_ns if clock_ns is not None else time.monotonic_ns
        self._times: list[int] = []
        self._append = self._times.append
        self._multi: dict[int, int] | None = None  # commit index -> tokens, for commits of k != 1
        self.sent = 0
        self.proposed = 0
        self.invalid = 0
        self._prefix_bytes: bytes | None = None
        self._suffix = b""
        self._plen = self._slen = 0

    def commit(self, k: int = 1, proposed: int = 0) -> None:
        """``k`` output tokens committed now (``proposed``: draft tokens proposed for them)."""
        if k is _ONE and proposed is _ZERO:
            try:
                self._append(self._clock())
            except Exception:
                self.invalid += 1
            return
        self._commit_more(k, proposed)

    def _commit_more(self, k: object, proposed: object) -> None:
        k_ok = _count(k)
        if not 1 <= k_ok <= _K_MAX:
            self.invalid += 1
            return
        try:
            t = self._clock()
        except Exception:
            self.invalid += 1
            return
        p = _count(proposed)
        if p < 0:
            self.invalid += 1
        else:
            self.proposed += p
        if k_ok != 1:
            if self._multi is None:
                self._multi = {}
            self._multi[len(self._times)] = k_ok
        self._append(t)

    def send(self, n: int = 1) -> None:
        """``n`` output tokens handed to the transport for the client."""
        if n is _ONE:
            self.sent += 1
            return
        c = _count(n)
        if c < 0:
            self.invalid += 1
        else:
            self.sent += c

    def expect_plain(self, prefix: bytes | None, suffix: bytes, /) -> None:
        """The bytes before and after the text of the stream's plain content chunks (``prefix`` None: none)."""
        if prefix is None:
            self._prefix_bytes, self._suffix, self._plen, self._slen = None, b"", 0, 0
            return
        if type(prefix) is not bytes or type(suffix) is not bytes:
            raise TypeError("expect_plain(prefix, suffix): bytes, or None to expect none")
        self._prefix_bytes, self._suffix, self._plen, self._slen = prefix, suffix, len(prefix), len(suffix)

    def commit_plain(self, body: object, /) -> bool:
        """Whether ``body`` is one plain content chunk (prefix, a non-empty text holding no quote, suffix); then
        one token is committed now."""
        pre = self._prefix_bytes
        if pre is None or type(body) is not bytes:
            return False
        end = len(body) - self._slen
        if end <= self._plen or not body.startswith(pre) or not body.endswith(self._suffix):
            return False
        if body.find(b'"', self._plen, end) >= 0:
            return False
        self.commit()
        return True

    def __len__(self) -> int:
        return len(self._times)

    def count_until(self, until_ns: int) -> int:
        """Commits left once the trailing ones later than ``until_ns`` are dropped."""
        times = self._times
        m = len(times)
        while m and times[m - 1] > until_ns:
            m -= 1
        return m

    def time_ns(self, i: int) -> int:
        """The time of commit ``i``, ns (``0 <= i < len(log)``)."""
        if not 0 <= i < len(self._times):
            raise IndexError(f"commit {i} outside 0..{len(self._times) - 1}")
        return self._times[i]

    def _prefix(self, m: int) -> int:
        if not 0 <= m <= len(self._times):
            raise IndexError(f"commit prefix {m} outside 0..{len(self._times)}")
        return m

    def generated(self, m: int) -> int:
        """Tokens in the first ``m`` commits."""
        m = self._prefix(m)
        multi = self._multi
        return m if multi is None else m + sum(k - 1 for i, k in multi.items() if i < m)

    def itl(self, m: int, bounds_ns: Sequence[int]) -> ItlCounts | None:
        """Token-weighted ITL of the first ``m`` commits against ``bounds_ns`` (ascending ns).

        Non-cumulative counts per bound (``+Inf`` last), their sum and their maximum, seconds; ``None``
        with fewer than two commits. A steady stream (smallest and largest gap in one bucket) needs no
        sort; otherwise the gaps are sorted once (in C) and each bound found by bisection.
        """
        m = self._prefix(m)
        if m < 2:
            return None
        times = self._times
        total_s = (times[m - 1] - times[0]) / 1e9
        multi = self._multi
        if multi is not None and any(0 < i < m for i in multi):
            keys: list[int] = []
            hi: float = 0.0
            for i in range(1, m):
                g = times[i] - times[i - 1]
                k = multi.get(i, 1)
                keys.extend([-(-g // k)] * k)
                v = g if k == 1 else g / k
                if i == 1 or v > hi:
                    hi = v
            keys.sort()
            return _bucket_sorted(keys, bounds_ns), total_s, hi / 1e9
        gaps = list(map(sub, islice(times, 1, m), times))
        top = max(gaps)
        first = bisect_left(bounds_ns, min(gaps))
        if first == bisect_left(bounds_ns, top):
            counts = [0] * (len(bounds_ns) + 1)
            counts[first] = len(gaps)
            return counts, total_s, top / 1e9
        gaps.sort()
        return _bucket_sorted(gaps, bounds_ns), total_s, top / 1e9

    def gaps_s(self, m: int) -> list[float]:
        """The token-weighted ITL gaps of the first ``m`` commits, seconds, in commit order."""
        m = self._prefix(m)
        times = self._times
        multi = self._multi or {}
        out: list[float] = []
        for i in range(1, m):
            g = times[i] - times[i - 1]
            k = multi.get(i, 1)
            out.extend([(g if k == 1 else g / k) / 1e9] * k)
        return out


def _bucket_sorted(keys: list[int], bounds_ns: Sequence[int]) -> list[int]:
    counts = []
    prev = 0
    for b in bounds_ns:
        c = bisect_right(keys, b)
        counts.append(c - prev)
        prev = c
    counts.append(len(keys) - prev)
    return counts


NativeFactory = Callable[[Callable[[], int] | None], TokenLogLike]


def _native() -> NativeFactory | None:
    try:
        from llmslo.telemetry._tokenlog_c import TokenLog as Native
    except ImportError:
        return None
    return Native


NativeTokenLog: NativeFactory | None = _native()
"""The native token log, or ``None`` when its module was not built (no C compiler at install)."""

NATIVE_CLOCK = (sys.implementation.name == "cpython"
                and time.get_clock_info("monotonic").implementation == "clock_gettime(CLOCK_MONOTONIC)")
"""Whether the native log's own clock read is ``time.monotonic_ns`` (so it can skip the Python call)."""


def token_log_factory(clock_ns: Callable[[], int]) -> Callable[[], TokenLogLike]:
    """What makes a token log reading ``clock_ns`` (chosen once per :class:`Telemetry`, called per request):
    native when built, with its own clock read when that reads the same clock, else pure Python."""
    if NativeTokenLog is not None:
        if clock_ns is time.monotonic_ns and NATIVE_CLOCK:
            return NativeTokenLog  # type: ignore[return-value]  # called with no argument: its own clock
        return functools.partial(NativeTokenLog, clock_ns)
    return functools.partial(PyTokenLog, clock_ns)
