"""Client behaviours, chosen per request and seeded: slow readers, cancels, a client timeout.

- :class:`SlowReader` (``--slow-reader SHARE@TOKENS_PER_S``): that share of the requests reads its stream at
  that pace. Its connections have a small receive buffer (``SO_RCVBUF``), so the server's sends stall
  instead of filling a large kernel buffer: the pace is felt by the server, as a slow client's would be.
- :class:`Cancel` (``--cancel SHARE@DELAY``): that share of the requests hangs up ``DELAY`` after it was sent.
- ``timeout_s`` (``--timeout``): every request hangs up when it has run that long.

Which requests get a behaviour depends only on the seed and the request's index (a hash, not a shared random
stream), so the same seed gives the same choice whatever the order in which requests finish. Standard
library only.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

from llmslo.loadgen._schedule import SpecError, parse_seconds

SHARE_FORM = "a fraction 0..1 or a percentage (0.1 or 10%)"
SLOW_READER_FORM = "SHARE@TOKENS_PER_S, e.g. 0.1@20 or 10%@20 (a tenth of the requests read 20 tokens/s)"
CANCEL_FORM = "SHARE@DELAY, e.g. 0.05@2s or 5%@500ms (one request in 20 hangs up 2 s after it was sent)"

DEFAULT_SLOW_RCVBUF_BYTES = 65_536
"""Receive buffer (``SO_RCVBUF``) of a slow reader's sockets, bytes; Linux doubles it, and holds about half
for the TCP window. Smaller stalls streams on loopback: its segments are 64 KiB, and a receive window below
one segment leaves the sender waiting for its persist timer (measured: 16 KiB read 2 MB in 52 s instead of
2 s). A slow reader's kernel then holds at most about 128 KiB of its stream, where autotuning would grow
the buffer to megabytes."""


def _share(flag: str, text: str, form: str) -> float:
    t = text.strip()
    try:
        value = float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        raise SpecError(flag, text, form, "cannot read the SHARE in") from None
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise SpecError(flag, text, form, f"SHARE must be {SHARE_FORM}, got")
    return value


def _split(flag: str, text: str, form: str) -> tuple[str, str]:
    found = re.fullmatch(r"\s*([^@]+)@([^@]+)", text)
    if found is None:
        raise SpecError(flag, text, form)
    return found.group(1), found.group(2).strip()


@dataclass(frozen=True, slots=True)
class SlowReader:
    """``share`` (0..1) of the requests read their stream at ``tokens_per_s`` tokens per second."""

    share: float
    tokens_per_s: float

    def __post_init__(self) -> None:
        if not (0.0 <= self.share <= 1.0) or not (math.isfinite(self.tokens_per_s) and self.tokens_per_s > 0):
            raise SpecError("--slow-reader", f"{self.share}@{self.tokens_per_s}", SLOW_READER_FORM,
                            "needs 0 <= SHARE <= 1 and TOKENS_PER_S > 0, got")

    @classmethod
    def parse(cls, text: str, flag: str = "--slow-reader") -> SlowReader:
        """``SHARE@TOKENS_PER_S``; :class:`SpecError` naming ``flag`` otherwise."""
        share, pace = _split(flag, text, SLOW_READER_FORM)
        try:
            tokens_per_s = float(pace)
        except ValueError:
            raise SpecError(flag, text, SLOW_READER_FORM, "cannot read TOKENS_PER_S in") from None
        if not (math.isfinite(tokens_per_s) and tokens_per_s > 0):
            raise SpecError(flag, text, SLOW_READER_FORM, "TOKENS_PER_S must be > 0, got")
        return cls(_share(flag, share, SLOW_READER_FORM), tokens_per_s)


@dataclass(frozen=True, slots=True)
class Cancel:
    """``share`` (0..1) of the requests hang up ``delay_s`` seconds after they were sent."""

    share: float
    delay_s: float

    def __post_init__(self) -> None:
        if not (0.0 <= self.share <= 1.0) or not (math.isfinite(self.delay_s) and self.delay_s > 0):
            raise SpecError("--cancel", f"{self.share}@{self.delay_s}s", CANCEL_FORM,
                            "needs 0 <= SHARE <= 1 and DELAY > 0, got")

    @classmethod
    def parse(cls, text: str, flag: str = "--cancel") -> Cancel:
        """``SHARE@DELAY``; :class:`SpecError` naming ``flag`` otherwise."""
        share, delay = _split(flag, text, CANCEL_FORM)
        try:
            delay_s = parse_seconds(flag, delay)
        except SpecError:
            raise SpecError(flag, text, CANCEL_FORM, "cannot read the DELAY in") from None
        return cls(_share(flag, share, CANCEL_FORM), delay_s)


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """What one request does besides asking: read at ``slow_tokens_per_s`` (None: as fast as it can), hang up
    after ``cancel_after_s`` (None: never on purpose), hang up after ``timeout_s`` (None: no client timeout)."""

    slow_tokens_per_s: float | None = None
    cancel_after_s: float | None = None
    timeout_s: float | None = None

    @property
    def deadline_s(self) -> float | None:
        """Seconds after the send when the client hangs up, whichever comes first (None: never)."""
        times = [t for t in (self.cancel_after_s, self.timeout_s) if t is not None]
        return min(times) if times else None

    @property
    def deadline_cause(self) -> str | None:
        """``cancel`` or ``timeout``: which of the two sets :attr:`deadline_s`."""
        if self.cancel_after_s is not None and (self.timeout_s is None or self.cancel_after_s <= self.timeout_s):
            return "cancel"
        return "timeout" if self.timeout_s is not None else None


@dataclass(frozen=True, slots=True)
class Behaviours:
    """The client behaviours of a run, seeded by ``seed``."""

    slow_reader: SlowReader | None = None
    cancel: Cancel | None = None
    timeout_s: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.timeout_s is not None and not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise SpecError("--timeout", self.timeout_s, "a duration > 0, e.g. 30s", "must be > 0, got")

    def _draw(self, kind: str, index: int) -> float:
        """A number in [0, 1) fixed by the seed, the behaviour and the request's index."""
        digest = hashlib.blake2b(f"{self.seed}:{kind}:{index}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2.0**64

    def plan(self, index: int) -> RequestPlan:
        """The plan of request ``index``."""
        slow = self.slow_reader
        cancel = self.cancel
        pace = slow.tokens_per_s if slow is not None and self._draw("slow", index) < slow.share else None
        after = cancel.delay_s if cancel is not None and self._draw("cancel", index) < cancel.share else None
        return RequestPlan(pace, after, self.timeout_s)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "slow_reader": None if self.slow_reader is None else {
                "share": self.slow_reader.share, "tokens_per_s": self.slow_reader.tokens_per_s},
            "cancel": None if self.cancel is None else {"share": self.cancel.share, "delay_s": self.cancel.delay_s},
            "timeout_s": self.timeout_s,
            "seed": self.seed,
        }
