"""A simulated continuous-batching engine behind a small interface (a real model could sit behind it).

The :class:`Engine` protocol is what the HTTP app needs: ``submit`` a request (its tracker, prompt size,
``max_tokens``, the stream its tokens go to), ``run`` the step loop, ``close`` it. :class:`SimulatedEngine`
implements it with an asyncio step loop, as vLLM-style engines schedule:

- **Admission to the batch**: requests wait in the engine's FIFO queue until the batch has room
  (``max_num_seqs`` sequences) and the KV cache has blocks for their prompt plus the first output token
  (``kv_blocks`` blocks of ``block_size`` tokens). Strictly first come, first served: a head that does not
  fit holds the rest back.
- **A step** prefills the requests that join (their first token comes from the prefill) and decodes one
  token for every running sequence that may take one; its duration is the profile's
  ``prefill_s(joining prompt tokens) + decode_s(decoded sequences)``, divided by ``speed``, and is slept
  with asyncio, so overload produces real queueing.
- **KV growth**: a sequence takes one more block each ``block_size`` tokens; when none is free the
  newest running sequence is preempted (its blocks freed, back to the head of the queue, re-prefilled with
  its prompt and the tokens it had when it rejoins), as vLLM's recompute preemption does.
- **Release**: a request's blocks are released exactly once, at its terminal state, through
  ``tracker.add_resource`` (whatever ends it: the last token sent, a client cancel, a deadline, the drain,
  an engine error). A sequence that finished generating leaves the batch at once but keeps its blocks until
  its response is complete (at most the stream's capacity of tokens later).
- **Backpressure**: a sequence whose stream holds ``pause_at`` chunks (the client reads slower than the
  engine writes) gets no token in the steps until the stream drains; it stays in the batch holding its
  blocks. The wait goes through the stream's ``wait_credit()``, which accounts the paused time
  (``stream_paused_s`` of the summary) and enforces the stream's slow-consumer policy.
- **Output length**: exactly ``max_tokens`` with ``ignore_eos``; otherwise a natural length drawn per
  request from ``random.Random(f"{seed}:{request_id}")`` (geometric with mean ``mean_output_tokens``),
  ending ``stop`` when shorter than ``max_tokens``, else ``length``.
- **Failure injection**: with ``error_rate`` > 0, a request fails with that probability (same seeded
  draw), at an output position drawn uniformly: the engine finishes it ``error`` (``engine_error``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from llmslo.server._profile import EngineProfile
from llmslo.telemetry import ConfigurationError, LlmsloError

Token = tuple[str, str | None]
"""One streamed token: its text, and the finish reason (``stop`` / ``length``) on the last one."""

MAX_CATCH_UP_S = 0.05
"""How far (seconds) the step loop catches up on a schedule it fell behind; beyond, it starts afresh."""

ENGINE_ERROR = "engine_error"
"""The ``error_type`` of a request the engine failed (failure injection)."""

WORDS = ("the", "model", "writes", "a", "short", "answer", "about", "latency", "and", "tokens", "under",
         "load", "while", "each", "request", "waits", "for", "its", "turn", "in", "batch", "of", "sequences",
         "that", "share", "one", "GPU")
"""The simulated vocabulary: output tokens are these words, one per token."""


class EngineTracker(Protocol):
    """What the engine needs from a request's tracker (:class:`llmslo.telemetry.RequestTracker` has it)."""

    @property
    def request_id(self) -> str: ...

    @property
    def done(self) -> bool: ...

    def commit(self, k: int = 1, proposed: int = 0) -> None: ...

    def schedule(self) -> None: ...

    def finish(self, reason: str, *, error_type: str | None = None) -> bool: ...

    def add_resource(self, release: Callable[[], object], name: str = "resource") -> None: ...


class TokenStream(Protocol):
    """Where a sequence's tokens go (:class:`llmslo.telemetry.SendQueue` has it): the engine puts each token
    after committing it, closes the stream after the last one, and awaits ``wait_credit()`` once the stream
    holds ``pause_at`` chunks."""

    def __len__(self) -> int: ...

    def put(self, chunk: Token, tokens: int = 1) -> None: ...

    def close(self) -> None: ...

    async def wait_credit(self) -> None: ...


class Engine(Protocol):
    """The engine interface of the server (a simulated one today; a real model would implement the same)."""

    @property
    def kv_blocks_free(self) -> int: ...

    def check(self, prompt_tokens: int, max_tokens: int) -> str | None: ...

    def submit(self, tracker: EngineTracker, prompt_tokens: int, max_tokens: int, *, ignore_eos: bool,
               stream: TokenStream, pause_at: int | None) -> Sequence: ...

    async def run(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The simulated engine's configuration. Raises :class:`ConfigurationError` naming the field.

    - ``max_num_seqs``: sequences in the running batch at most.
    - ``kv_blocks`` × ``block_size``: the KV cache, in blocks of tokens.
    - ``speed``: time scale (2.0 runs steps twice as fast as the profile says; tests use a fast engine).
    - ``mean_output_tokens``: mean natural output length without ``ignore_eos`` (tokens).
    - ``seed``: the seed of the per-request draws (length, failure).
    - ``error_rate``: the share of requests the engine fails (0 to 1).
    """

    profile: EngineProfile
    max_num_seqs: int = 256
    kv_blocks: int = 16384
    block_size: int = 16
    speed: float = 1.0
    mean_output_tokens: float = 128.0
    seed: int = 0
    error_rate: float = 0.0

    def __post_init__(self) -> None:
        for field in ("max_num_seqs", "kv_blocks", "block_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"EngineConfig.{field}: must be an integer >= 1, got {value!r}")
        for field in ("speed", "mean_output_tokens"):
            value = getattr(self, field)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigurationError(f"EngineConfig.{field}: must be a finite number > 0, got {value!r}")
        if not (isinstance(self.error_rate, int | float) and 0 <= self.error_rate <= 1):
            raise ConfigurationError(f"EngineConfig.error_rate: must be a share from 0 to 1, got {self.error_rate!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigurationError(f"EngineConfig.seed: must be an integer, got {self.seed!r}")


WAITING, RUNNING, FINISHED, ENDED = "waiting", "running", "finished", "ended"
"""A sequence's states: in the engine's queue; in the batch; done generating (its response completing);
its request reached its terminal state (blocks released)."""


class Sequence:
    """The engine's state of one request (token counts; KV blocks held)."""

    __slots__ = ("blocks", "fail_at", "generated", "max_tokens", "output_tokens", "pause_at", "pauser",
                 "prompt_tokens", "releases", "state", "stream", "tracker", "word")

    def __init__(self, tracker: EngineTracker, prompt_tokens: int, max_tokens: int, output_tokens: int,
                 fail_at: int | None, word: int, stream: TokenStream, pause_at: int | None) -> None:
        self.tracker = tracker
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.output_tokens = output_tokens
        """Tokens this request will generate (its natural length, or ``max_tokens``)."""
        self.fail_at = fail_at
        """The output position at which the engine fails it (failure injection), or None."""
        self.word = word
        self.stream = stream
        self.pause_at = pause_at
        self.generated = 0
        self.blocks = 0
        self.pauser: asyncio.Task[None] | None = None
        """The task waiting for the stream's credit while the client is behind (None: not paused)."""
        self.state = WAITING
        self.releases = 0
        """How many times its blocks were released (1 once its request ended: the test of exactly once)."""

    @property
    def finish_reason(self) -> str:
        """``length`` when it generates ``max_tokens``, else ``stop``."""
        return "length" if self.output_tokens >= self.max_tokens else "stop"


class KvCache:
    """A count of free KV blocks; taking more than is free or giving back more than was taken raises."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total

    def take(self, n: int) -> bool:
        """Take ``n`` blocks if free; whether it did."""
        if n > self.free:
            return False
        self.free -= n
        return True

    def give(self, n: int) -> None:
        """Give back ``n`` blocks (an error when that makes more free than exist: a double release)."""
        if n < 0 or self.free + n > self.total:
            raise LlmsloError(f"KV cache: giving back {n} blocks with {self.free} of {self.total} free "
                              "(released twice?)")
        self.free += n


class SimulatedEngine:
    """The simulated continuous-batching engine (see the module docstring). ``sleep`` (an awaitable of
    seconds) and ``clock`` (seconds; the event loop's by default) are injectable, so a test can run it on
    virtual time.

    Example::

        engine = SimulatedEngine(EngineConfig(PROFILES[DEFAULT_PROFILE], speed=10.0))
        loop_task = asyncio.create_task(engine.run())
        seq = engine.submit(tracker, prompt_tokens=12, max_tokens=64, ignore_eos=False,
                            stream=queue, pause_at=16)
        ...
        engine.close(); await loop_task
    """

    def __init__(self, config: EngineConfig, *, sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                 clock: Callable[[], float] | None = None) -> None:
        self.config = config
        self.kv = KvCache(config.kv_blocks)
        self._sleep = sleep
        self._clock = clock
        self._waiting: deque[Sequence] = deque()
        self._running: dict[int, Sequence] = {}  # insertion order = join order (the newest is preempted)
        self._wake = asyncio.Event()
        self._closed = False
        self._pausers: set[asyncio.Task[None]] = set()
        self.steps = 0
        """Engine steps taken."""
        self.step_log: list[tuple[int, int, float]] | None = None
        """When a list: ``(prefill tokens, decoded sequences, step seconds before scaling)`` per step."""
        self.preemptions = 0

    # ---- the interface -----------------------------------------------------------------------------------

    @property
    def kv_blocks_free(self) -> int:
        """KV blocks free now."""
        return self.kv.free

    @property
    def waiting(self) -> int:
        """Requests in the engine's queue (not ended)."""
        return sum(1 for s in self._waiting if s.state == WAITING)

    @property
    def running(self) -> int:
        """Sequences in the batch."""
        return len(self._running)

    def blocks_for(self, tokens: int) -> int:
        """KV blocks that hold ``tokens`` tokens."""
        return -(-tokens // self.config.block_size)

    def check(self, prompt_tokens: int, max_tokens: int) -> str | None:
        """Why a request could never be served (its tokens exceed the whole KV cache), else None."""
        need = self.blocks_for(prompt_tokens + max_tokens)
        if need > self.kv.total:
            cap = self.kv.total * self.config.block_size
            return (f"prompt tokens ({prompt_tokens}) + max_tokens ({max_tokens}) exceed the KV cache "
                    f"({cap} tokens): ask for fewer tokens")
        return None

    def submit(self, tracker: EngineTracker, prompt_tokens: int, max_tokens: int, *, ignore_eos: bool,
               stream: TokenStream, pause_at: int | None) -> Sequence:
        """Queue a request; its tokens go to ``stream``. Registers the release of its blocks on ``tracker``."""
        rng = random.Random(f"{self.config.seed}:{tracker.request_id}")
        natural = 1 + int(rng.expovariate(1.0 / self.config.mean_output_tokens))
        output = max_tokens if ignore_eos else min(max_tokens, natural)
        fail_at = None
        if self.config.error_rate > 0 and rng.random() < self.config.error_rate:
            fail_at = rng.randrange(output)
        seq = Sequence(tracker, prompt_tokens, max_tokens, output, fail_at, rng.randrange(len(WORDS)), stream,
                       pause_at)
        self._waiting.append(seq)
        tracker.add_resource(lambda: self._release(seq), "kv_blocks")
        self._wake.set()
        return seq

    def close(self) -> None:
        """Stop the step loop (requests still in it are left to their trackers)."""
        self._closed = True
        self._wake.set()
        for task in list(self._pausers):
            task.cancel()

    async def run(self) -> None:
        """The step loop, until :meth:`close`.

        Steps are timed against a running schedule (``due``, the loop's clock) rather than slept one by one:
        the event loop sleeps in whole milliseconds, so a fast engine (a high ``speed``) would otherwise run
        slower than its profile. A step that starts late is caught up by the next ones, by at most
        :data:`MAX_CATCH_UP_S`.
        """
        now = self._clock if self._clock is not None else asyncio.get_running_loop().time
        due = now()
        while not self._closed:
            decoding = self._grow([s for s in self._running.values() if s.pauser is None])  # running first
            joined = self._join()
            if not joined and not decoding:
                self._wake.clear()
                await self._wake.wait()
                due = now()
                continue
            prefill = sum(s.prompt_tokens + s.generated for s in joined)
            step = self.config.profile.step_s(prefill, len(decoding))
            if self.step_log is not None:
                self.step_log.append((prefill, len(decoding), step))
            due += step / self.config.speed
            delay = due - now()
            if delay < -MAX_CATCH_UP_S:
                due, delay = now(), 0.0
            await self._sleep(max(delay, 0.0))
            self.steps += 1
            for seq in (*joined, *decoding):
                if seq.state == RUNNING:
                    self._emit(seq)

    # ---- steps -------------------------------------------------------------------------------------------

    def _join(self) -> list[Sequence]:
        """Move requests from the queue into the batch while it has room and their blocks are free."""
        joined: list[Sequence] = []
        waiting = self._waiting
        while waiting and len(self._running) < self.config.max_num_seqs:
            seq = waiting[0]
            if seq.state != WAITING:
                waiting.popleft()
                continue
            need = self.blocks_for(seq.prompt_tokens + seq.generated + 1)
            if not self.kv.take(need):
                break
            waiting.popleft()
            seq.blocks = need
            seq.state = RUNNING
            self._running[id(seq)] = seq
            seq.tracker.schedule()
            joined.append(seq)
        return joined

    def _grow(self, decoding: list[Sequence]) -> list[Sequence]:
        """Give each decoding sequence the block its next token needs, preempting the newest when none is
        free; the sequences still decoding."""
        for seq in decoding:
            if seq.state != RUNNING:
                continue
            need = self.blocks_for(seq.prompt_tokens + seq.generated + 1) - seq.blocks
            while need > 0 and seq.state == RUNNING:
                if self.kv.take(need):
                    seq.blocks += need
                    need = 0
                else:
                    self._preempt(next(reversed(self._running.values())))
        return [s for s in decoding if s.state == RUNNING]

    def _preempt(self, seq: Sequence) -> None:
        """Free the blocks of ``seq`` and put it back at the head of the queue (recomputed when it rejoins)."""
        self.preemptions += 1
        self._running.pop(id(seq), None)
        self.kv.give(seq.blocks)
        seq.blocks = 0
        seq.state = WAITING
        self._waiting.appendleft(seq)

    def _emit(self, seq: Sequence) -> None:
        """One token for ``seq``: commit it, put it on the stream; finish, fail or pause as due."""
        tracker = seq.tracker
        if tracker.done:
            return
        if seq.fail_at is not None and seq.generated == seq.fail_at:
            tracker.finish("error", error_type=ENGINE_ERROR)
            return
        seq.generated += 1
        last = seq.generated >= seq.output_tokens
        text = WORDS[(seq.word + seq.generated) % len(WORDS)] + " "
        tracker.commit()
        seq.stream.put((text, seq.finish_reason if last else None))
        if last:
            seq.state = FINISHED
            self._running.pop(id(seq), None)
            seq.stream.close()
            self._wake.set()
        elif seq.pause_at is not None and len(seq.stream) >= seq.pause_at:
            task = seq.pauser = asyncio.get_running_loop().create_task(self._await_credit(seq))
            self._pausers.add(task)
            task.add_done_callback(self._pausers.discard)

    async def _await_credit(self, seq: Sequence) -> None:
        """Wait until the client drained the stream of ``seq`` (its policy may end the request meanwhile)."""
        with contextlib.suppress(LlmsloError):  # StreamClosed: the request ended while paused
            await seq.stream.wait_credit()
        seq.pauser = None
        self._wake.set()

    def _release(self, seq: Sequence) -> None:
        """The request reached its terminal state (called once by its tracker): free its blocks."""
        seq.releases += 1
        if seq.state == RUNNING:
            self._running.pop(id(seq), None)
        if seq.pauser is not None:  # its wait for credit ends with it (the paused-streams gauge too)
            seq.pauser.cancel()
            seq.pauser = None
        seq.state = ENDED
        blocks, seq.blocks = seq.blocks, 0
        self.kv.give(blocks)
        self._wake.set()
