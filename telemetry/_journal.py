"""The write-ahead journal of requests: what a crash of the server would otherwise erase.

A request's summary row is made at its terminal state and written later, in batches, by the summary sink. A
server killed with SIGKILL (or by the OOM killer, or a segfault) loses the requests in flight and the
summaries still queued: at the server they never happened, while their clients recorded errors. The journal
keeps, on disk, an entry per request from its arrival until its summary is written, so the next start (or
``llmslo ingest --recover DIR``) turns each request without a summary into a summary row of its own
(:func:`recover_journal`, :func:`crash_row`).

**The request path only appends to memory.** :meth:`Journal.open_request` (at arrival),
:meth:`Journal.end_request` (at the terminal state, the summary handed to the sink) and
:meth:`Journal.close_request` (once the summary is written) append a tuple or an id to a deque (no lock, no
I/O, never raises); a background thread writes what is queued every ``flush_interval_s`` seconds, or at once
when ``flush_entries`` requests wait. A request that arrived within the last flush interval before a crash is
therefore not in the journal. Every ``progress_interval_s`` seconds the thread also asks each open request for
its progress (prompt tokens, tokens generated and sent, queue, first- and latest-token times) and writes what
changed, so a crash row knows roughly how far its request got.

**Files.** A journal is a folder of segments, ``segment-<n>.wal``, each a text file of JSON lines (one JSON
object a line, appended; a line is never rewritten), and a ``lock`` file a running writer holds
(``flock``): a second writer, or a recovery while a server writes, is refused (:class:`JournalInUse`). Every
time is an integer number of **microseconds** (Unix microseconds for a point in time, microseconds since the
request's arrival for an interval: integers cost a fraction of what decimal fractions cost to write), and -1
stands for unknown. The lines:

- ``{"journal": 1, "run": R, "segment": n, "t": T}``: the first line of a segment (``run``: one id per
  :class:`Journal` object, i.e. per server process);
- ``{"o": id, "a": arrival, "m": model, "v": version, "c": tenant_class, "p": prompt_tokens}``: a request
  opened (``"n": 1``: it has no progress to read); in a checkpoint it also carries its last progress ``g``, the
  last time its progress was read ``r``, ``"d": 1`` once it ended, and ``k``: the last time it was known in
  flight, when that is not the run's last time (it ended, or an earlier run opened it);
- ``{"g": {id: [prompt, generated, sent, queue, ttft, last_token], ...}}``: progress that changed;
- ``{"d": [id, ...]}``: requests that reached their terminal state (their summaries handed to the sink, not yet
  written); each was last known in flight at the batch before;
- ``{"x": [id, ...]}``: requests closed (their summaries written, or counted dropped by the sink);
- ``{"t": T}``: the end of a batch: the process was alive at ``T`` and every request open and not ended then was
  in flight; ``{"t": T, "r": 1}``: and the progress of each of those that has progress was read (at ``T`` or
  just after).

**Bounded.** Once the current segment holds ``segment_bytes`` after its checkpoint, a new segment starts with
a checkpoint (one ``o`` line per open request) and the older segments are deleted, so the folder holds one
segment, briefly two. What happens at the caps (each counted in :attr:`Journal.dropped` by reason and on the
guard, never blocking, never raising): more than ``capacity`` requests waiting in memory (``buffer_full``) or
more than ``max_open`` requests open (``max_open``): the new request is not journaled (a crash then loses it,
as without a journal); an ``o`` line longer than ``MAX_LINE_BYTES`` (``too_long``): the same. A failed write
(a full disk) is counted on the guard and the next batch starts a new segment with a full checkpoint.

**Crashes.** The background thread ``write()``s each batch to the operating system, which keeps it when the
process dies; ``fsync=True`` also syncs each batch to the disk (against a power cut, at a cost per batch). A
line cut short by a crash mid-write is skipped and counted when read (:attr:`JournalState.torn_lines`). A
clean :meth:`Journal.close` (at exit) with no request left open deletes the segments: a journal left empty by
a clean exit means nothing was lost.

Standard library only; independent of :class:`Telemetry` (which calls it when given ``journal=``), so any
server or gateway can journal its requests.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import index
from pathlib import Path
from typing import Any, NamedTuple

from llmslo.telemetry._errors import ConfigurationError, LlmsloError
from llmslo.telemetry._guard import Guard
from llmslo.telemetry._summary import validate_summary

try:
    import fcntl
except ImportError:  # not on this platform: the journal works, unlocked
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CRASH_ERROR_TYPE",
    "MAX_LINE_BYTES",
    "Journal",
    "JournalEntry",
    "JournalInUse",
    "JournalState",
    "Progress",
    "RecoveryReport",
    "crash_row",
    "ensure_journal_free",
    "read_journal",
    "recover_journal",
    "stored_in_jsonl",
]

JOURNAL_FORMAT = 1
"""The version of the journal's line format (each segment's first line says it)."""
CRASH_ERROR_TYPE = "server_crash"
"""The ``error_type`` of a row recovered from the journal; its ``e2e_s`` is a lower bound (see :func:`crash_row`)."""
MAX_LINE_BYTES = 1024
"""The longest ``o`` line the journal writes (bytes); a longer entry is not journaled (``too_long``)."""
LOCK_NAME = "lock"
SEGMENT = re.compile(r"^segment-(\d{8,})\.wal$")

_encode = json.encoder.encode_basestring  # a JSON string literal; C-accelerated where built


class JournalInUse(LlmsloError):
    """Another process holds the journal's folder (a running server writes it)."""


class Progress(NamedTuple):
    """How far an open request got: what a progress callable returns (``None`` where not known).

    ``prompt_tokens`` (None: keep the one given at open), ``generated_tokens`` and ``sent_tokens`` (output
    tokens committed and handed to the transport), and seconds since arrival on the server's monotonic
    clock: ``queue_s`` (scheduled), ``ttft_s`` (first token), ``last_token_s`` (latest token).
    """

    prompt_tokens: int | None
    generated_tokens: int
    sent_tokens: int
    queue_s: float | None
    ttft_s: float | None
    last_token_s: float | None


ProgressSource = Callable[[], Sequence[Any]]
"""Returns a :class:`Progress` (or a 6-sequence in its order); called on the journal's thread."""


@dataclass(frozen=True)
class JournalEntry:
    """A request the journal holds open: what was known at arrival, its last progress, whether it had ended
    (its summary handed to the sink, not yet written), ``known_until_unix_s``: the last time it was known in
    flight (the last batch its process wrote before it ended, or before the process died), and
    ``read_unix_s``: the last time its progress was read (None: never), when ``progress`` was true."""

    request_id: str
    arrival_unix_s: float
    model: str
    version: str
    tenant_class: str
    prompt_tokens: int | None
    progress: Progress | None
    known_until_unix_s: float
    ended: bool = False
    read_unix_s: float | None = None


@dataclass(frozen=True)
class JournalState:
    """What a journal's folder holds: the requests still open (in order of arrival in the journal), the
    requests closed, the lines skipped as torn or unreadable, the segments read and the last segment number."""

    pending: tuple[JournalEntry, ...]
    closed: int
    torn_lines: int
    segments: tuple[Path, ...]
    last_segment: int


@dataclass(frozen=True)
class RecoveryReport:
    """What :func:`recover_journal` did: ``recovered`` requests got a row (``ended`` of them had reached their
    terminal state, their summaries not yet written), ``already_stored`` had a summary where the rows go,
    ``torn_lines`` were skipped; ``rows`` are the rows written."""

    journal: Path
    recovered: int
    already_stored: int
    torn_lines: int
    rows: tuple[dict[str, object], ...]
    ended: int = 0

    def message(self) -> str:
        """``recovered N requests from the journal; M already had summaries`` (with how many of the N had
        ended, and the torn lines, if any)."""
        n, m = self.recovered, self.already_stored
        text = (f"recovered {n:,} request{'' if n == 1 else 's'} from the journal"
                + (f" ({self.ended:,} of them had ended, their summaries unwritten)" if self.ended else "")
                + "; " + ("1 already had a summary" if m == 1 else f"{m:,} already had summaries"))
        if self.torn_lines:
            text += (f"; {self.torn_lines:,} torn line{'' if self.torn_lines == 1 else 's'} skipped (a write cut "
                     "short by the crash)")
        return text


# ---- the writer --------------------------------------------------------------------------------------------

# An open request as the journal's thread holds it, from its open to its close: one list (cheaper to make than an
# object) of what open_request queued (a checkpoint writes its "o" line again from it: keeping the line itself
# would hold a hundred bytes more per open request) with its progress source, set to None once the request ended
# (so that a finished request's tracker is not kept alive until its summary is written), then its last progress
# (the JSON 6-array) or None, whether it ended, the last time it was known in flight (Unix microseconds) when that
# is not the run's last time, its id as a JSON string, and the last time its progress was read (Unix
# microseconds) or None.
_RID, _ARRIVAL, _MODEL, _VERSION, _TENANT, _PROMPT, _SOURCE, _FIGURES, _ENDED, _KNOWN, _ID, _READ = range(12)
# (the hot loops of _take write these numbers out)
assert (_SOURCE, _ENDED, _KNOWN, _ID) == (6, 8, 9, 10)
# A progress, formatted with % on the journal's thread (its six numbers: printf-style formatting of a whole tuple
# costs less than an f-string per number). %d of a float truncates: "+ 0.5" first makes it round. An "o" line is
# an f-string of whole numbers (:func:`_open_line`): 90 ns less per request than % of a float.
_FIGS = "[%d,%d,%d,%d,%d,%d]"


class Journal:
    """An append-only, bounded journal of open requests in ``folder`` (created if missing); see the module
    docstring for the files, the caps and what a crash keeps.

    Parameters (keyword-only after ``folder``): ``segment_bytes`` (bytes written after a segment's checkpoint
    before the next segment starts), ``max_open`` (requests open at once), ``capacity`` (requests waiting in
    memory to be written), ``flush_interval_s`` (seconds between background writes), ``flush_entries``
    (waiting requests that wake the writer early), ``progress_interval_s`` (seconds between progress reads; 0:
    at every write), ``fsync`` (sync each batch to the disk), ``guard`` (counts failures; :class:`Telemetry`
    passes its own), ``clock_unix_s`` (wall-clock seconds).

    Opening a folder an earlier process left entries in keeps them (``carried``): they are copied into the
    first checkpoint, with the last time that process knew them in flight, until :func:`recover_journal` turns
    them into rows. Raises :class:`JournalInUse` when another process writes the folder,
    :class:`ConfigurationError` naming the field for a bad parameter, ``OSError`` when the folder cannot be
    made or written.

    Example (what :class:`Telemetry` does with ``journal=``)::

        journal = Journal("summaries.journal")
        journal.open_request("req-1", time.time(), "llama", "v1", "default", 42)
        ...                              # the request runs
        journal.end_request("req-1")     # its summary is handed to the sink
        journal.close_request("req-1")   # the sink wrote it
        journal.close()                  # at exit
    """

    def __init__(self, folder: str | os.PathLike[str], *, segment_bytes: int = 8 << 20, max_open: int = 100_000,
                 capacity: int = 100_000, flush_interval_s: float = 0.05, flush_entries: int = 4096,
                 progress_interval_s: float = 1.0, fsync: bool = False, guard: Guard | None = None,
                 clock_unix_s: Callable[[], float] = time.time) -> None:
        for name, value in (("segment_bytes", segment_bytes), ("max_open", max_open), ("capacity", capacity),
                            ("flush_entries", flush_entries)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"Journal.{name}: must be an integer >= 1, got {value!r}")
        for name, seconds, least in (("flush_interval_s", flush_interval_s, 1e-3),
                                     ("progress_interval_s", progress_interval_s, 0.0)):
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
                    math.isfinite(seconds) and seconds >= least):
                raise ConfigurationError(f"Journal.{name}: must be a finite number of seconds >= {least:g}, "
                                         f"got {seconds!r}")
        self.folder = Path(folder)
        self.segment_bytes = segment_bytes
        self.max_open = max_open
        self.flush_interval_s = float(flush_interval_s)
        self.progress_interval_s = float(progress_interval_s)
        self.fsync = fsync
        self.guard = guard if guard is not None else Guard()
        self._own_guard = guard is None
        self.clock_unix_s = clock_unix_s
        self._capacity = capacity
        self._flush_entries = flush_entries
        # what the request path hands over, one deque per kind (appends are atomic: no lock)
        self._opens: deque[tuple[Any, ...]] = deque()
        self._ends: deque[str] = deque()
        self._closes: deque[Any] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._write_lock = threading.Lock()  # one batch at a time (the thread, flush(), close())
        self._open: dict[str, list[Any]] = {}
        self._names: dict[tuple[str, str, str], str] = {}
        self._run = secrets.token_hex(8)
        self._fh: Any = None
        self._segment = 0
        self._since_checkpoint = 0
        self._last_t = -1  # the last batch's time, Unix microseconds
        self._last_progress = -math.inf
        self._broken = False
        self.dropped: dict[str, int] = {"buffer_full": 0, "max_open": 0, "too_long": 0}
        self.entries_written = 0
        self.is_closed = False
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = _lock(self.folder)
        try:
            state = read_journal(self.folder)
            self.carried = len(state.pending)
            for e in state.pending:
                figures = None if e.progress is None else _figures(e.progress)
                read = None if e.read_unix_s is None else _micros(e.read_unix_s)
                self._open[e.request_id] = [e.request_id, e.arrival_unix_s, e.model, e.version, e.tenant_class,
                                            e.prompt_tokens, None, figures, e.ended, _micros(e.known_until_unix_s),
                                            _encode(e.request_id), read]
            self._segment = state.last_segment
            with self._write_lock:
                self._start_segment()
        except BaseException:
            self._release()
            raise
        self._thread = threading.Thread(target=self._run_thread, name="llmslo-journal", daemon=True)
        self._thread.start()

    # ---- the request path: memory only ---------------------------------------------------------------------

    def open_request(self, request_id: str, arrival_unix_s: float, model: str, version: str, tenant_class: str,
                     prompt_tokens: int | None = None, progress: ProgressSource | None = None) -> None:
        """Journal a request that arrived at ``arrival_unix_s`` (Unix seconds); ``progress`` (optional) is
        called on the journal's thread for its :class:`Progress`. Never blocks, never raises: beyond
        ``capacity`` waiting requests it is not journaled (counted ``buffer_full``)."""
        q = self._opens
        n = len(q)
        if n >= self._capacity:
            self._count_drop("buffer_full", 1)
            return
        q.append((request_id, arrival_unix_s, model, version, tenant_class, prompt_tokens, progress))
        if n == self._flush_entries:
            self._wake.set()

    def end_request(self, request_id: str) -> None:
        """The request reached its terminal state and its summary was handed to the sink: no more progress to
        read, and should the process die before the summary is written, its row says it was last known in
        flight at the batch before this one. Never blocks or raises."""
        self._ends.append(request_id)

    def close_request(self, request_id: str) -> None:
        """The request's summary is written (or counted dropped): it needs no recovery. Never blocks or raises
        (an id the journal does not hold open is ignored when written)."""
        self._closes.append(request_id)

    def close_rows(self, rows: Iterable[Mapping[str, object]]) -> None:
        """:meth:`close_request` the ``request_id`` of each summary row (a summary sink's listener)."""
        try:
            self._closes.extend([r["request_id"] for r in rows])
        except Exception as exc:
            self.guard.error("journal.close_rows", exc)

    def attach(self, telemetry: Any) -> None:
        """Count this journal's failures on ``telemetry``'s guard (``llmslo_internal_errors_total``) unless it
        was given its own guard (``Telemetry(journal=...)`` calls this)."""
        if self._own_guard:
            self._own_guard = False
            self.guard = telemetry.guard

    @property
    def open_requests(self) -> int:
        """Requests the journal's thread holds open (as of its last batch)."""
        return len(self._open)

    # ---- the journal's thread ------------------------------------------------------------------------------

    def _count_drop(self, reason: str, n: int) -> None:
        self.dropped[reason] += n
        self.guard.error(f"journal.{reason}", JournalFullError(reason, n))

    def _run_thread(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            self.flush()

    def flush(self) -> None:
        """Write what is queued now (the background thread calls this every ``flush_interval_s``). Never
        raises: a failure is counted on the guard and the next batch starts a new segment."""
        with self._write_lock:
            if not self.is_closed:
                self._flush_guarded()
                if self.is_closed:  # close() stopped waiting for this write: its files are closed here
                    self._close_files()

    def _flush_guarded(self) -> None:
        try:
            self._flush_locked()
        except Exception as exc:
            self._broken = True
            self.guard.error("journal.write", exc)

    def _flush_locked(self) -> None:
        lines: list[str] = []
        now = self.clock_unix_s()  # before the take: every entry queued by now is in this batch
        opened = self._take(lines)
        t = _micros(now)
        read = now - self._last_progress >= self.progress_interval_s
        if read:
            self._last_progress = now
            changed = self._progress_line(t)
            if changed:
                lines.append(changed)
        if not lines and not self._open:
            return
        lines.append(f'{{"t":{t},"r":1}}\n' if read else f'{{"t":{t}}}\n')
        if self._broken or self._fh is None:
            self._start_segment()  # after a failed write: a full checkpoint in a new segment
        self._write("".join(lines))
        self._last_t = t
        self.entries_written += opened
        if self._since_checkpoint >= self.segment_bytes:
            self._start_segment()

    def _take(self, lines: list[str]) -> int:
        """Move the queued entries into ``lines`` and the open set; the number of requests opened.

        The closes are counted first, then the ends, then the opens, and that many of each taken: a request's
        open is queued before its end and its end before its close, so whatever end or close is taken finds its
        open taken now or before. The closes are taken before the ends: a request whose summary was written
        since the last batch is written closed only (an ``x`` and no ``d``: its end says nothing a recovery
        could use). (The journal's cost per request is mostly here: a few dictionary operations and one
        formatted string per request.)"""
        n_closes, n_ends, n_opens = len(self._closes), len(self._ends), len(self._opens)
        opened = self._take_opens(n_opens, lines, n_closes)
        live = self._open
        if n_closes:
            pop, take = live.pop, self._closes.popleft
            closed: list[str] = []
            add = closed.append
            for _ in range(n_closes):
                o = pop(take(), None)
                if o is not None:
                    add(o[10])  # _ID
            if closed:
                lines.append('{"x":[' + ",".join(closed) + "]}\n")
        if n_ends:
            get, take, known = live.get, self._ends.popleft, self._last_t
            ended: list[str] = []
            add = ended.append
            for _ in range(n_ends):
                o = get(take())
                if o is not None and not o[8]:  # _ENDED (None: closed in this batch or before)
                    o[6] = None  # _SOURCE
                    o[8] = True  # _ENDED
                    o[9] = known  # _KNOWN
                    add(o[10])  # _ID
            if ended:
                lines.append('{"d":[' + ",".join(ended) + "]}\n")
        return opened

    def _take_opens(self, n: int, lines: list[str], closing: int) -> int:
        """Take ``n`` opens (``closing``: closes taken after them, which free their places first)."""
        # this loop is most of the journal's cost per request: _open_line inlined, names bound locally
        live, names, take, cap = self._open, self._names, self._opens.popleft, self.max_open + closing
        named_as, encode, longest, append = names.get, _encode, MAX_LINE_BYTES, lines.append
        opened = too_long = full = 0
        for _ in range(n):
            item = take()
            rid, arrival, model, version, tenant, prompt, source = item
            if len(live) >= cap:
                full += 1
                continue
            try:
                named = named_as((model, version, tenant))
                if named is None:
                    if len(names) >= 4096:
                        names.clear()
                    named = names[(model, version, tenant)] = _names(model, version, tenant)
                erid = encode(rid)  # raises TypeError for an id that is not a string
                if not arrival >= 0:  # NaN too
                    raise ValueError(f"arrival_unix_s must be a number of seconds >= 0, got {arrival!r}")
                a = int(arrival * 1e6 + 0.5)  # OverflowError for infinity
                if prompt is None:
                    prompt = -1
                elif prompt.__class__ is not int:
                    prompt = index(prompt)  # TypeError for a count that is not an integer
                line = (f'{{"o":{erid},"a":{a},{named},"p":{prompt}}}\n' if source is not None else
                        f'{{"o":{erid},"a":{a},{named},"p":{prompt},"n":1}}\n')
            except Exception as exc:  # not a string id, not a number: that entry only
                self.guard.error("journal.entry", exc)
                continue
            if len(line) > longest:
                too_long += 1
                continue
            live[rid] = [rid, arrival, model, version, tenant, prompt, source, None, False, None, erid, None]
            append(line)
            opened += 1
        if full:
            self._count_drop("max_open", full)
        if too_long:
            self._count_drop("too_long", too_long)
        return opened

    def _progress_line(self, t: int) -> str | None:
        """Read the progress of every open request that has some (at ``t``, Unix microseconds); the ``g`` line of
        what changed, or None."""
        parts: list[str] = []
        for o in list(self._open.values()):
            source = o[_SOURCE]
            if source is None:
                continue
            try:
                figures = _figures(source())
            except Exception as exc:
                self.guard.error("journal.progress", exc)
                continue
            o[_READ] = t
            if figures != o[_FIGURES]:
                o[_FIGURES] = figures
                parts.append(f"{o[_ID]}:{figures}")
        return '{"g":{' + ",".join(parts) + "}}\n" if parts else None

    def _write(self, text: str) -> None:
        fh = self._fh
        fh.write(text)
        fh.flush()
        if self.fsync:
            os.fsync(fh.fileno())
        self._since_checkpoint += len(text)

    def _start_segment(self) -> None:
        """A new segment: its header, a checkpoint of every open request, synced; then the older segments
        go (everything they held open is in the checkpoint)."""
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None
        self._segment += 1
        path = self.folder / f"segment-{self._segment:08d}.wal"
        fh = path.open("a", encoding="utf-8")
        now = _micros(self.clock_unix_s())
        parts = [json.dumps({"journal": JOURNAL_FORMAT, "run": self._run, "segment": self._segment, "t": now},
                            separators=(",", ":")) + "\n"]
        for _, arrival, model, version, tenant, prompt, source, figures, ended, known, rid, read in self._open.values():
            extra = "" if figures is None else ',"g":' + figures
            if read is not None:
                extra += f',"r":{read}'
            if ended:
                extra += ',"d":1'
            if known is not None:
                extra += f',"k":{known}'
            elif source is None:
                extra += ',"n":1'
            parts.append(_open_line(rid, arrival, _names(model, version, tenant), prompt)[:-2] + extra + "}\n")
        parts.append(f'{{"t":{now}}}\n')
        fh.write("".join(parts))
        fh.flush()
        os.fsync(fh.fileno())
        self._fh = fh
        self._since_checkpoint = 0
        self._last_t = now
        self._broken = False
        for old in _segments(self.folder):
            if old != path:
                with contextlib.suppress(FileNotFoundError):
                    old.unlink()

    # ---- shutdown ------------------------------------------------------------------------------------------

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, write what is queued, and close the files, waiting at most ``timeout_s`` seconds
        for a write in progress (a hung disk: the journal is then left as it is, counted on the guard). With no
        request left open the segments are deleted (a clean exit leaves nothing to recover); otherwise they stay
        for the next start. Later opens are not journaled (``buffer_full``). Idempotent; never raises."""
        if self.is_closed:
            return
        deadline = time.monotonic() + timeout_s
        self._capacity = 0
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout_s)
        if not self._write_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self.is_closed = True  # the stuck write keeps the folder's lock: the process is on its way out
            self.guard.error("journal.close", TimeoutError(f"a write did not return within {timeout_s:g} s"))
            return
        try:
            self._flush_guarded()
            self.is_closed = True
            clean = not (self._open or self._opens or self._ends or self._closes or self._broken)
            self._close_files()
            if clean:
                for path in _segments(self.folder):
                    path.unlink(missing_ok=True)
        except Exception as exc:
            self.guard.error("journal.close", exc)
        finally:
            self.is_closed = True
            self._write_lock.release()
            self._release()

    def _close_files(self) -> None:
        """Close the segment being written and release the folder's lock."""
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None
        self._release()

    def _release(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)  # releases the flock

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class JournalFullError(Exception):
    """Requests the journal could not take (what the guard counts and logs)."""

    def __init__(self, reason: str, n: int) -> None:
        super().__init__(f"{n} request(s) not journaled ({reason})")


# ---- lines -------------------------------------------------------------------------------------------------


def _micros(seconds: Any) -> int:
    """Seconds as whole microseconds (rounded); raises ``ValueError`` for NaN, ``OverflowError`` for infinity."""
    return int(seconds * 1e6 + 0.5)


def _names(model: object, version: object, tenant: object) -> str:
    """The ``m``, ``v`` and ``c`` members of an ``o`` line (the journal caches them: they repeat)."""
    for what, value in (("model", model), ("version", version), ("tenant_class", tenant)):
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a string, got {value!r}")
    return f'"m":{_encode(str(model))},"v":{_encode(str(version))},"c":{_encode(str(tenant))}'


def _figures(v: Sequence[Any]) -> str:
    """A progress as its JSON array of integers (counts, then intervals in microseconds; -1: unknown), what
    :func:`_progress` reads back. Raises ``TypeError``, ``ValueError`` or ``OverflowError`` for a value that is
    not a number or not finite."""
    p, g, n, qs, fs, ls = v
    return _FIGS % (-1 if p is None else p, g, n, -1 if qs is None else qs * 1e6 + 0.5,
                    -1 if fs is None else fs * 1e6 + 0.5, -1 if ls is None else ls * 1e6 + 0.5)


def _open_line(rid: str, arrival: float, names: str, prompt: int | None) -> str:
    """The ``o`` line (``rid``: the id JSON-encoded; ``names``: from :func:`_names`), as in a checkpoint (the
    loop of :meth:`Journal._take_opens` writes the same line, inlined). Raises ``ValueError`` for an arrival
    before 1970 or NaN, ``OverflowError`` for infinity, ``TypeError`` for a prompt count that is not an integer."""
    if not arrival >= 0:  # NaN too
        raise ValueError(f"arrival_unix_s must be a number of seconds >= 0, got {arrival!r}")
    a = int(arrival * 1e6 + 0.5)
    p = -1 if prompt is None else index(prompt)
    return f'{{"o":{rid},"a":{a},{names},"p":{p}}}\n'


def _count(x: object) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


def _seconds(micros: object) -> float | None:
    """Seconds from a journal's microseconds (None for unknown: -1, or anything but a whole number >= 0)."""
    return micros / 1e6 if isinstance(micros, int) and not isinstance(micros, bool) and micros >= 0 else None


def _progress(value: Sequence[object]) -> Progress:
    """A :class:`Progress` from a journal's progress array (counts, microseconds; bad fields read as unknown)."""
    prompt, generated, sent, queue, ttft, last = value
    return Progress(_count(prompt), _count(generated) or 0, _count(sent) or 0, _seconds(queue), _seconds(ttft),
                    _seconds(last))


# ---- reading -----------------------------------------------------------------------------------------------


def _segments(folder: Path) -> list[Path]:
    """The segment files of ``folder``, oldest first."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for path in folder.iterdir():
            m = SEGMENT.match(path.name)
            if m:
                found.append((int(m.group(1)), path))
    return [p for _, p in sorted(found)]


def _lines(path: Path) -> Iterator[dict[str, Any] | None]:
    """Each line of a segment parsed: a JSON object, or None (a line cut short by a crash, or damaged)."""
    with path.open("rb") as fh:
        data = fh.read()
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    for line in raw:
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        yield obj if isinstance(obj, dict) else None


def read_journal(folder: str | os.PathLike[str]) -> JournalState:
    """Read a journal's segments (without taking its lock): the requests still open, each with its last
    progress, the last time it was known in flight and the last time its progress was read (times in seconds,
    read from the journal's microseconds). A line that is not a JSON object (a write cut short by a crash, or
    damage), or an ``o`` line without its fields, is skipped and counted; nothing raises but ``OSError`` on a
    segment that cannot be read. A folder that does not exist holds nothing."""
    base = Path(folder)
    paths = _segments(base)
    pending: dict[str, dict[str, Any]] = {}
    alive: dict[str, float] = {}  # per run: the last batch's time
    reads: dict[str, tuple[float, int]] = {}  # per run: the last progress read's time and line number
    closed = torn = last = number = 0

    def last_read(e: dict[str, Any]) -> float | None:
        """The entry's last progress read: its own, or its run's last one after it was opened."""
        read = reads.get(e["run"])
        if e["progress_read"] and read is not None and read[1] > e["line"]:
            return read[0] if e["read"] is None else max(e["read"], read[0])
        return e["read"]  # type: ignore[no-any-return]

    for path in paths:
        m = SEGMENT.match(path.name)
        last = max(last, int(m.group(1))) if m else last
        run = f"?{path.name}"  # a segment whose header is lost is a run of its own
        for obj in _lines(path):
            number += 1
            if obj is None:
                torn += 1
            elif "o" in obj:
                entry = _entry(obj, run, number)
                if entry is None:
                    torn += 1
                else:
                    pending[entry["request_id"]] = entry
            elif "g" in obj:
                for rid, value in (obj["g"] if isinstance(obj["g"], dict) else {}).items():
                    e = pending.get(rid)
                    if e is not None and isinstance(value, list) and len(value) == 6:
                        e["progress"] = _progress(value)
            elif "d" in obj:
                for rid in obj["d"] if isinstance(obj["d"], list) else ():
                    e = pending.get(rid) if isinstance(rid, str) else None
                    if e is not None and not e["frozen"]:  # in flight until the batch before
                        e["ended"], e["frozen"], e["known"] = True, True, alive.get(run)
                        e["read"] = last_read(e)
            elif "x" in obj:
                for rid in obj["x"] if isinstance(obj["x"], list) else ():
                    if isinstance(rid, str) and pending.pop(rid, None) is not None:
                        closed += 1
            else:
                if "journal" in obj:
                    run = str(obj.get("run", run))
                t = _seconds(obj.get("t"))
                if t is not None:
                    alive[run] = max(alive.get(run, -math.inf), t)
                    if obj.get("r") == 1:
                        reads[run] = (t, number)
    entries = []
    for e in pending.values():
        if not e["frozen"]:
            e["known"], e["read"] = alive.get(e["run"]), last_read(e)
        arrival = e["arrival_unix_s"]
        known = max(arrival, e["known"] if e["known"] is not None else arrival)
        read = None if e["read"] is None else min(max(arrival, e["read"]), known)
        entries.append(JournalEntry(e["request_id"], arrival, e["model"], e["version"], e["tenant_class"],
                                    e["prompt_tokens"], e["progress"], known, e["ended"], read))
    return JournalState(tuple(entries), closed, torn, tuple(paths), last)


def _entry(obj: Mapping[str, Any], run: str, number: int) -> dict[str, Any] | None:
    """The fields of an ``o`` line (None when it lacks one), ``number`` its line number in the journal. An
    entry with ``k`` (an earlier run's, or ended) is frozen: its times are its own, not its run's."""
    rid, arrival = obj.get("o"), _seconds(obj.get("a"))
    names = [obj.get(k) for k in ("m", "v", "c")]
    if not isinstance(rid, str) or not rid or arrival is None or not all(isinstance(n, str) for n in names):
        return None
    progress, known = obj.get("g"), _seconds(obj.get("k"))
    return {"request_id": rid, "arrival_unix_s": arrival, "model": names[0], "version": names[1],
            "tenant_class": names[2], "prompt_tokens": _count(obj.get("p")),
            "progress": _progress(progress) if isinstance(progress, list) and len(progress) == 6 else None,
            "known": known, "read": _seconds(obj.get("r")), "ended": obj.get("d") == 1, "frozen": known is not None,
            "progress_read": obj.get("n") != 1, "run": run, "line": number}


# ---- recovery ----------------------------------------------------------------------------------------------


def crash_row(entry: JournalEntry) -> dict[str, object]:
    """The summary row of a request the journal held open when its server died: ``finish_reason`` ``error``,
    ``error_type`` :data:`CRASH_ERROR_TYPE`, what was known at arrival, and its last progress.

    ``e2e_s`` is a **lower bound**, seconds since arrival: for a request with a first token, the last time it
    was known in flight (the last batch its server wrote before the request ended, or before the server died);
    for one without, the last time it was seen without one (its last progress read; 0 when never read), since
    the censoring-aware TTFT takes such a row as waiting at least ``e2e_s`` for its first token, as any admitted
    row that ended without a token. ``generated_tokens`` and ``sent_tokens`` are those of its last progress read
    (lower bounds too); ``ttft_s``, ``last_token_s`` and ``queue_s`` are observed times when known, else null. A
    request that had ended, its summary not yet written (``entry.ended``), gets the same row: what its summary
    said is lost with it.
    """
    p = entry.progress
    generated = p.generated_tokens if p is not None else 0
    ttft = p.ttft_s if p is not None and generated else None
    last = p.last_token_s if p is not None and generated else None
    if ttft is None or last is None:
        ttft = last = None
        generated = 0
    queue = p.queue_s if p is not None else None
    if queue is not None and ttft is not None:
        queue = min(queue, ttft)
    if ttft is not None:
        seen = entry.known_until_unix_s
    else:  # censored at its e2e_s: the last time it was seen without a first token, when its progress was read
        seen = entry.read_unix_s if entry.read_unix_s is not None else entry.arrival_unix_s
    e2e = max(seen - entry.arrival_unix_s, 0.0, *(x for x in (queue, ttft, last) if x is not None))
    prompt = p.prompt_tokens if p is not None and p.prompt_tokens is not None else entry.prompt_tokens
    return {
        "request_id": entry.request_id,
        "model": entry.model or "unknown",
        "version": entry.version or "unknown",
        "tenant_class": entry.tenant_class or "default",
        "arrival_unix_s": entry.arrival_unix_s,
        "finish_reason": "error",
        "reject_reason": None,
        "error_type": CRASH_ERROR_TYPE,
        "queue_s": queue,
        "ttft_s": ttft,
        "last_token_s": last,
        "e2e_s": round(e2e, 6),
        "prompt_tokens": prompt if prompt is not None else 0,
        "proposed_tokens": 0,
        "generated_tokens": generated,
        "sent_tokens": min(p.sent_tokens, generated) if p is not None else 0,
        "client_ttft_s": None,
        "stream_paused_s": 0.0,
        "stream_max_queued": 0,
    }


def recover_journal(folder: str | os.PathLike[str], write: Callable[[list[dict[str, object]]], int | None], *,
                    stored: Callable[[Sequence[str]], Collection[str]] | None = None) -> RecoveryReport:
    """Turn each request the journal in ``folder`` holds open into one summary row (:func:`crash_row`) and hand
    the rows to ``write`` in one call; then empty the journal. Idempotent: a second run adds nothing.

    ``stored(ids)`` (optional) returns those of ``ids`` that already have a summary where the rows go; they get
    no row. ``write(rows)`` writes the rows (raising on failure: the journal is then kept as it was) and
    returns how many of them the destination already held and skipped (a store that skips known ids), or None.
    Holds the folder's lock throughout: raises :class:`JournalInUse` while a server writes it. A folder that
    does not exist, or holds no segment, gives a report of zeros.
    """
    base = Path(folder)
    if not base.is_dir():
        return RecoveryReport(base, 0, 0, 0, ())
    fd = _lock(base)
    try:
        state = read_journal(base)
        ids = [e.request_id for e in state.pending]
        have = set(stored(ids)) if stored is not None and ids else set()
        todo = [e for e in state.pending if e.request_id not in have]
        rows = [crash_row(e) for e in todo]
        for row in rows:
            broken = validate_summary(row)
            if broken:  # crash_row makes valid rows from whatever it read: this is a bug, not bad input
                raise LlmsloError(f"journal {base}: the recovered row of {row['request_id']!r} breaks the summary "
                                  f"contract ({broken[0].message}); the journal is kept as it was")
        skipped = (write(rows) or 0) if rows else 0
        for path in state.segments:
            path.unlink(missing_ok=True)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    ended = sum(1 for e in todo if e.ended)
    return RecoveryReport(base, len(rows) - skipped, len(have) + skipped, state.torn_lines, tuple(rows),
                          min(ended, len(rows) - skipped))


def ensure_journal_free(folder: str | os.PathLike[str]) -> None:
    """Raise :class:`JournalInUse` (naming the process) when a running server writes the journal in ``folder``:
    what a command checks before it changes anything, to recover the journal afterwards. A folder that does not
    exist is free."""
    base = Path(folder)
    if base.is_dir():
        os.close(_lock(base))


def _lock(folder: Path) -> int:
    """Take the folder's lock (its ``lock`` file, ``flock`` exclusive, not waiting); the open descriptor.
    Raises :class:`JournalInUse` naming the holder's pid when another process holds it."""
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    if fcntl is None:
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = ""
        with contextlib.suppress(OSError, ValueError):
            holder = os.pread(fd, 32, 0).decode().strip()
        os.close(fd)
        who = f"process {holder}" if holder else "another process"
        raise JournalInUse(f"the journal {folder} is in use by {who} (a running server writes it)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def stored_in_jsonl(folder: str | os.PathLike[str], ids: Collection[str]) -> set[str]:
    """Those of ``ids`` that have a summary in the JSONL files (``*.jsonl``) of ``folder``, as
    :class:`JsonlWriter` writes them; a line cut short or not a JSON object is skipped. A missing folder holds
    none."""
    wanted = set(ids)
    found: set[str] = set()
    base = Path(folder)
    if not wanted or not base.is_dir():
        return found
    prefix = '{"request_id":'
    for path in sorted(base.glob("*.jsonl")):
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                rid = _request_id(line, prefix)
                if rid in wanted:
                    found.add(rid)
        if found == wanted:
            break
    return found


def _request_id(line: str, prefix: str) -> str | None:
    """The ``request_id`` of a whole JSONL summary line (the writer puts it first: read without parsing the
    rest); None for a line cut short (a crash mid-write: ``llmslo ingest`` would refuse it)."""
    if not line.rstrip("\r\n").endswith("}"):
        return None
    if line.startswith(prefix) and line[len(prefix):len(prefix) + 1] == '"':
        try:
            return str(json.decoder.scanstring(line, len(prefix) + 1)[0])  # type: ignore[attr-defined]
        except ValueError:
            return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    rid = obj.get("request_id") if isinstance(obj, dict) else None
    return rid if isinstance(rid, str) else None
