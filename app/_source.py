"""Opening the store for the app: read-only, briefly, or through a snapshot while a server writes it.

DuckDB lets one process write a file and no other process open it meanwhile, not even to read. A server
that writes request summaries (``DuckDBSummaryWriter``) holds its store open for as long as it runs, so
the app, finding the file locked, copies it (the database file, then its write-ahead log) into a
temporary folder and reads the copy, saying when it was taken; the copy is kept for the session until the
person asks for a new one, and removed when the app stops. A copy that changed while it was being made is
made again (up to :data:`SNAPSHOT_ATTEMPTS` times); one that still cannot be read gives a clear message.

Without a writer the store itself is opened read-only for one run of the page and closed at its end, so
that the app never keeps a writer out for longer than a page takes to compute.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmslo.analysis import Store, StoreError

__all__ = ["SNAPSHOT_ATTEMPTS", "SNAPSHOT_KEY", "Opened", "Snapshot", "SourceError", "discard_snapshot",
           "open_source", "snapshot_note", "take_snapshot"]

SNAPSHOT_ATTEMPTS = 3
"""Copies tried before giving up on a store that keeps changing while it is copied."""
SNAPSHOT_KEY = "llmslo_snapshot"
"""Where a session keeps its snapshot (in ``st.session_state``)."""
_FOLDERS: set[Path] = set()


class SourceError(Exception):
    """The store cannot be read; the message says why and what to do."""


@dataclass(frozen=True)
class Snapshot:
    """A copy of a store that another process holds open for writing: the copy's ``path`` (in its own
    temporary ``folder``), the ``store`` it copies, and when it was taken (``taken_unix_s``, Unix seconds)."""

    store: Path
    path: Path
    folder: Path
    taken_unix_s: float
    holder: str


@dataclass(frozen=True)
class Opened:
    """The store open for one run of the page: ``store`` (read-only), the path the person gave (``db``), the
    ``snapshot`` read instead of it (None: the store itself), and ``token``, which changes whenever what is
    read changes (the cache key of every figure computed from it)."""

    store: Store
    db: Path
    snapshot: Snapshot | None
    token: tuple[Any, ...]


def _wal(path: Path) -> Path:
    return path.with_name(path.name + ".wal")


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


def _token(path: Path) -> tuple[Any, ...]:
    return (str(path.resolve()), _stat(path), _stat(_wal(path)))


def _locked(exc: StoreError) -> str | None:
    """The lock holder named in DuckDB's message when ``exc`` says the file is locked; None otherwise."""
    text = str(exc)
    if "lock" not in text.lower():
        return None
    marker = "Conflicting lock is held in "
    if marker in text:
        return text.split(marker, 1)[1].split(". See also", 1)[0].strip()
    return "another process"


def _copy(db: Path, folder: Path) -> Path | None:
    """Copy ``db`` and its write-ahead log into ``folder``; None when either changed during the copy."""
    target = folder / db.name
    before = (_stat(db), _stat(_wal(db)))
    shutil.copyfile(db, target)  # the database first: a checkpoint in between leaves an older, whole state
    if before[1] is not None:
        try:
            shutil.copyfile(_wal(db), _wal(target))
        except FileNotFoundError:  # checkpointed meanwhile
            return None
    after = (_stat(db), _stat(_wal(db)))
    return target if before == after else None


def _remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    _FOLDERS.discard(folder)


@atexit.register
def _remove_all() -> None:
    for folder in list(_FOLDERS):
        _remove(folder)


def take_snapshot(db: Path, holder: str) -> Snapshot:
    """Copy ``db`` (held open by ``holder``) into a new temporary folder and check that the copy opens.

    Raises :class:`SourceError` when no copy made in :data:`SNAPSHOT_ATTEMPTS` attempts opens as a store.
    """
    problem = "the file kept changing while it was copied"
    for attempt in range(SNAPSHOT_ATTEMPTS):
        folder = Path(tempfile.mkdtemp(prefix="llmslo-app-snapshot-"))
        _FOLDERS.add(folder)
        try:
            copy = _copy(db, folder)
        except OSError as exc:
            _remove(folder)
            raise SourceError(f"{db} is held open for writing by {holder}, and it cannot be copied for reading "
                              f"({exc.strerror or exc}): stop the writer, or free space for a copy") from None
        if copy is not None:
            try:
                Store.open(copy, read_only=True).close()
            except StoreError as exc:
                problem = f"the copy does not open ({exc})"
            else:
                return Snapshot(db, copy, folder, time.time(), holder)
        _remove(folder)
        time.sleep(0.05 * (attempt + 1))
    raise SourceError(f"{db} is held open for writing by {holder} (DuckDB lets no other process open it "
                      f"meanwhile), and no consistent copy could be made: {problem}. Reload the page to try "
                      "again, or stop the writer.")


def discard_snapshot(state: MutableMapping[Any, Any]) -> None:
    """Forget the session's snapshot and remove its copy (the next run takes a new one if still needed)."""
    snap = state.pop(SNAPSHOT_KEY, None)
    if isinstance(snap, Snapshot):
        _remove(snap.folder)


@contextmanager
def open_source(db: Path, state: MutableMapping[Any, Any]) -> Iterator[Opened]:
    """The store at ``db``, open read-only for the block, or the session's snapshot of it when another process
    holds it open for writing (taken now if the session has none of this store yet).

    ``state`` is the session's state (``st.session_state``). Raises :class:`SourceError` with a message for
    a person: no store at ``db``, a file that is no llmslo store, or one whose snapshot cannot be read.
    """
    try:
        store = Store.open(db, read_only=True)
    except StoreError as exc:
        holder = _locked(exc)
        if holder is None or not db.is_file():
            raise SourceError(str(exc)) from None
        snap = state.get(SNAPSHOT_KEY)
        if not (isinstance(snap, Snapshot) and snap.store == db and snap.path.is_file()):
            discard_snapshot(state)
            snap = take_snapshot(db, holder)
            state[SNAPSHOT_KEY] = snap
        try:
            store = Store.open(snap.path, read_only=True)
        except StoreError as again:
            discard_snapshot(state)
            raise SourceError(f"the snapshot of {db} cannot be read ({again}); reload the page") from None
        with store:
            yield Opened(store, db, snap, _token(snap.path))
        return
    discard_snapshot(state)  # the writer is gone: read the store itself again
    with store:
        yield Opened(store, db, None, _token(db))


def snapshot_note(snap: Snapshot) -> str:
    """The sentence every page shows while it reads a snapshot."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(snap.taken_unix_s))
    return (f"{snap.store} is held open for writing by {snap.holder}: showing a snapshot taken at {when} UTC "
            "(rows written after it are not shown; take a new snapshot to see them)")
