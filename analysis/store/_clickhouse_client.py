"""Connections to ClickHouse: embedded (``chdb``, one folder per process) or a server over HTTP.

A store URL names one of them:

* ``chdb:///abs/folder`` or ``chdb:relative/folder``: ClickHouse embedded in this process (the ``chdb``
  package), its tables kept in that folder;
* ``http://[user[:password]@]host:8123`` or ``https://…``: a ClickHouse server over its HTTP interface, through
  ``clickhouse-connect``.

Either takes ``?database=NAME`` (default :data:`DEFAULT_DATABASE`). Both clients answer queries as Arrow
tables, run statements, insert Arrow tables, and send small Arrow tables along with a query as temporary
tables (:meth:`ClickHouseClient.query_arrow` ``external``): chdb reads them from Python, a server receives them
as external data. Neither package is imported until a client is made.
"""

from __future__ import annotations

import io
import logging
import re
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from llmslo.analysis.store._store import StoreError
from llmslo.telemetry import ConfigurationError

__all__ = [
    "DEFAULT_DATABASE",
    "ClickHouseClient",
    "ClickHouseError",
    "ClickHouseUrl",
    "connect_clickhouse",
    "parse_clickhouse_url",
]

DEFAULT_DATABASE = "llmslo"
"""The ClickHouse database a store URL without ``?database=`` uses."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXTERNAL = re.compile(r"[a-z_][a-z0-9_]*")


class ClickHouseError(StoreError):
    """ClickHouse refused a query or cannot be reached, or holds no store at the URL; the message names the URL
    (without a password)."""


def _no_store(url: ClickHouseUrl) -> ClickHouseError:
    return ClickHouseError(f"no store at {url.shown}: create one with `llmslo ingest FILES --database clickhouse "
                           "--url URL`")


@dataclass(frozen=True)
class ClickHouseUrl:
    """A parsed store URL: ``kind`` ``chdb`` (``path`` is the folder) or ``http`` (``host``, ``port``,
    ``secure``, ``username``, ``password``), and the ``database``. :attr:`shown` is the URL without its
    password, for messages."""

    kind: str
    database: str
    path: Path | None = None
    host: str = ""
    port: int = 8123
    secure: bool = False
    username: str = "default"
    password: str = ""

    @property
    def shown(self) -> str:
        if self.kind == "chdb":
            return f"chdb:{self.path}?database={self.database}"
        user = f"{self.username}@" if self.username != "default" else ""
        scheme = "https" if self.secure else "http"
        return f"{scheme}://{user}{self.host}:{self.port}?database={self.database}"


def parse_clickhouse_url(url: str) -> ClickHouseUrl:
    """Parse a store URL (see the module docstring).

    Raises :class:`ConfigurationError` naming ``--url`` for another scheme, a chdb URL without a folder, an
    HTTP URL without a host or with a bad port, or a database name that is not an identifier.
    """
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query)
    unknown = sorted(set(query) - {"database"})
    if unknown:
        raise ConfigurationError(f"--url: unknown parameter(s) {', '.join(unknown)} in {_redact(url)}; "
                                 "only ?database=NAME is read")
    database = query.get("database", [DEFAULT_DATABASE])[-1]
    if not _NAME.fullmatch(database):
        raise ConfigurationError(f"--url: database {database!r} must be a name of letters, digits and _ "
                                 "(not starting with a digit)")
    if parts.scheme == "chdb":
        folder = parts.netloc + parts.path
        if not folder:
            raise ConfigurationError("--url: chdb: needs a folder, e.g. chdb:///var/lib/llmslo or chdb:store")
        return ClickHouseUrl("chdb", database, path=Path(folder))
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            raise ConfigurationError(f"--url: {_redact(url)} names no host, e.g. http://localhost:8123")
        try:
            port = parts.port
        except ValueError:
            raise ConfigurationError(f"--url: {_redact(url)} has a port that is not a number") from None
        secure = parts.scheme == "https"
        return ClickHouseUrl("http", database, host=parts.hostname, port=port or (8443 if secure else 8123),
                             secure=secure, username=urllib.parse.unquote(parts.username or "default"),
                             password=urllib.parse.unquote(parts.password or ""))
    raise ConfigurationError(f"--url: {_redact(url)} is no ClickHouse URL: use chdb:///FOLDER (embedded) or "
                             "http://HOST:8123 (a server)")


def _redact(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


class ClickHouseClient(Protocol):
    """What the store and the database need of a ClickHouse connection."""

    url: ClickHouseUrl

    def query_arrow(self, sql: str, external: Mapping[str, pa.Table] | None = None) -> pa.Table:
        """The result of ``sql`` (strings as text, no dictionary columns). ``external`` tables are readable
        in ``sql`` under :meth:`external_ref` of their names (lower-case identifiers)."""
        ...

    def command(self, sql: str) -> None:
        """Run a statement that returns nothing (DDL, ``INSERT … SELECT``)."""
        ...

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        """Append ``data`` to ``table`` (a name in the client's database), columns matched by name."""
        ...

    def external_ref(self, name: str) -> str:
        """How ``sql`` names the external table ``name``."""
        ...

    def close(self) -> None: ...


def _plain(table: pa.Table) -> pa.Table:
    """``table`` with dictionary-encoded columns decoded (LowCardinality over HTTP), binary as text."""
    columns = []
    for column in table.columns:
        if pa.types.is_dictionary(column.type):
            column = pc.cast(column, column.type.value_type)
        columns.append(column)
    return pa.Table.from_arrays(columns, names=table.column_names)


def _check_external(external: Mapping[str, pa.Table] | None) -> list[tuple[str, pa.Table]]:
    items = list((external or {}).items())
    for name, _ in items:
        if not _EXTERNAL.fullmatch(name):
            raise ValueError(f"external table name {name!r} must be a lower-case identifier")
    if len(items) > 2:
        raise ValueError("at most two external tables per query")
    return items


class _ChdbSessions:
    """The one chdb folder of this process, shared by every client that names it (chdb embeds one server
    per process, bound to one folder), closed with its last client."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.query_lock = threading.Lock()
        """Held while a query runs: the session is shared by every client of the folder, one query at a time."""
        self._path: Path | None = None
        self._session: Any = None
        self._users = 0

    def acquire(self, path: Path) -> Any:
        with self._lock:
            resolved = path.resolve()
            if self._session is not None and self._path != resolved:
                raise ClickHouseError(
                    f"chdb:{path}: this process already runs embedded ClickHouse over {self._path}, and chdb holds "
                    "one folder per process: close that store first, or use a server (http://HOST:8123)"
                )
            if self._session is None:
                try:
                    from chdb import session as chdb_session
                except ImportError:
                    raise ClickHouseError("chdb: the chdb package is not installed: pip install chdb") from None
                resolved.mkdir(parents=True, exist_ok=True)
                try:
                    self._session = chdb_session.Session(str(resolved))  # type: ignore[no-untyped-call]
                except Exception as exc:  # chdb raises its own error types
                    raise ClickHouseError(f"chdb:{path}: cannot open embedded ClickHouse: {exc}") from None
                self._path = resolved
            self._users += 1
            return self._session

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._session is not None:
                session, self._session, self._path = self._session, None, None
                session.close()


_CHDB = _ChdbSessions()


class ChdbClient:
    """ClickHouse embedded in this process (``chdb``), its tables in the URL's folder.

    The session's current database is the URL's (created when ``create``; set again before each statement,
    since clients of other databases share the session). Statements run one at a time (a lock shared by every
    client): chdb's session is not meant to be used by several threads at once.
    """

    def __init__(self, url: ClickHouseUrl, *, create: bool = True) -> None:
        assert url.path is not None
        if not create and not url.path.is_dir():
            raise _no_store(url)
        self.url = url
        self._session = _CHDB.acquire(url.path)
        self._lock = _CHDB.query_lock
        self._closed = False
        self._database: str | None = None
        try:
            if create:
                self.command(f"CREATE DATABASE IF NOT EXISTS {url.database}")
            elif not self.query_arrow(f"SELECT name FROM system.databases WHERE name = '{url.database}'").num_rows:
                raise _no_store(url)
            self._database = url.database
        except BaseException:
            self.close()
            raise

    def _run(self, sql: str, fmt: str, ext_0: pa.Table | None = None, ext_1: pa.Table | None = None) -> Any:
        # chdb's Python() table function reads ext_0 / ext_1 from this frame
        with self._lock:
            if self._closed:
                raise ClickHouseError(f"{self.url.shown}: the connection is closed")
            try:
                if self._database is not None:
                    self._session.query(f"USE {self._database}", "CSV")
                return self._session.query(sql, fmt)
            except Exception as exc:  # chdb's own error type, raised for any refused query
                raise ClickHouseError(f"{self.url.shown}: {_first_line(str(exc))}") from None

    def query_arrow(self, sql: str, external: Mapping[str, pa.Table] | None = None) -> pa.Table:
        items = _check_external(external)
        for i, (name, _) in enumerate(items):
            sql = sql.replace(self.external_ref(name), f"Python(ext_{i})")
        tables = [t for _, t in items] + [None, None]
        result = self._run(sql, "ArrowTable", tables[0], tables[1])
        return _plain(result)

    def command(self, sql: str) -> None:
        self._run(sql, "CSV")

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        names = ", ".join(_quote(n) for n in data.column_names)
        self._run(f"INSERT INTO {_quote(table)} ({names}) SELECT {names} FROM Python(ext_0)", "CSV", data)

    def external_ref(self, name: str) -> str:
        return f"__external_{name}"

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _CHDB.release()


def _first_line(message: str) -> str:
    text = message.strip()
    return text.split("\n", 1)[0][:2000]


def _quote(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


_STRUCTURE = {pa.string(): "String", pa.large_string(): "String", pa.float64(): "Float64", pa.int64(): "Int64"}


_QUIET = logging.NullHandler()
"""Added once (``addHandler`` ignores a handler already there) to clickhouse-connect's logger."""


class HttpClient:
    """A ClickHouse server over HTTP, through ``clickhouse-connect`` (one HTTP session per client)."""

    def __init__(self, url: ClickHouseUrl, *, create: bool = True) -> None:
        try:
            import clickhouse_connect
        except ImportError:
            raise ClickHouseError("the clickhouse-connect package is not installed: pip install 'llmslo[clickhouse]'"
                                  ) from None
        self.url = url
        # clickhouse-connect logs a bare "Unexpected Http Driver Exception" before it raises; with no logging set
        # up, Python prints it to stderr ahead of our error, which says the same with the cause. A NullHandler on
        # its logger stops that fallback only: an application's own logging still receives its records.
        logging.getLogger("clickhouse_connect").addHandler(_QUIET)
        try:
            boot = clickhouse_connect.get_client(host=url.host, port=url.port, username=url.username,
                                                 password=url.password, secure=url.secure)
            if create:
                boot.command(f"CREATE DATABASE IF NOT EXISTS {url.database}")
                found = True
            else:
                found = str(boot.command(f"SELECT count() FROM system.databases WHERE name = '{url.database}'")) != "0"
            boot.close()
            self._client = clickhouse_connect.get_client(host=url.host, port=url.port, username=url.username,
                                                         password=url.password, secure=url.secure,
                                                         database=url.database)
        except Exception as exc:  # connection refused, authentication, an old server: all end here
            raise ClickHouseError(f"{url.shown}: cannot connect: {_first_line(str(exc))}") from None
        if not found:
            self._client.close()
            raise _no_store(url)
        self._lock = threading.Lock()

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # clickhouse-connect's error types and the HTTP stack's
                raise ClickHouseError(f"{self.url.shown}: {_first_line(str(exc))}") from None

    def query_arrow(self, sql: str, external: Mapping[str, pa.Table] | None = None) -> pa.Table:
        items = _check_external(external)
        data = None
        if items:
            from clickhouse_connect.driver.external import ExternalData

            data = ExternalData()
            for name, table in items:
                structure = ", ".join(f"{_quote(f.name)} {_STRUCTURE[f.type]}" for f in table.schema)
                sink = io.BytesIO()
                import pyarrow.parquet as pq

                pq.write_table(table, sink)
                data.add_file(file_name=f"{name}.parquet", data=sink.getvalue(), fmt="Parquet", structure=structure)
                sql = sql.replace(self.external_ref(name), name)
        result = self._call(self._client.query_arrow, sql, external_data=data, use_strings=True)
        return _plain(result)

    def command(self, sql: str) -> None:
        self._call(self._client.command, sql)

    def insert_arrow(self, table: str, data: pa.Table) -> None:
        self._call(self._client.insert_arrow, table, data)

    def external_ref(self, name: str) -> str:
        return f"__external_{name}"

    def close(self) -> None:
        with self._lock:
            self._client.close()


def connect_clickhouse(url: str | ClickHouseUrl, *, create: bool = True) -> ClickHouseClient:
    """A client for the store URL ``url``; with ``create`` its database is created when missing.

    Raises :class:`ConfigurationError` for a malformed URL and :class:`ClickHouseError` when ClickHouse
    cannot be reached (or, for chdb, another folder is open in this process).
    """
    parsed = url if isinstance(url, ClickHouseUrl) else parse_clickhouse_url(url)
    if parsed.kind == "chdb":
        return ChdbClient(parsed, create=create)
    return HttpClient(parsed, create=create)
