"""A ClickHouse HTTP interface on 127.0.0.1 answered by chdb: for testing clients that speak HTTP to a server.

No ClickHouse server newer than 2018 can run here, and clickhouse-connect cannot talk to that one. This front
end takes the requests clickhouse-connect sends (the query in the body or in ``?query=``, settings and the
database as URL parameters, insert data in the body, possibly compressed, external tables as multipart form
data) and runs them in the process's chdb session (ClickHouse 26.x), answering in the format the query asks
for, with ClickHouse's error text and status on failure. What it does not do: authentication, sessions
(every request shares one), progress headers.
"""

from __future__ import annotations

import email.parser
import email.policy
import re
import shutil
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_NOT_SETTINGS = {"query", "query_id", "database", "session_id", "session_timeout", "session_check",
                 "client_protocol_version", "default_format", "user", "password"}
_FORMAT = re.compile(r"\s+FORMAT\s+(\w+)\s*;?\s*$", re.IGNORECASE)
_INSERT = re.compile(r"^\s*INSERT\s+INTO\s+(.+?)\s+FORMAT\s+(\w+)\s*$", re.IGNORECASE | re.DOTALL)


def _decompress(data: bytes, encoding: str | None) -> bytes:
    if not encoding or encoding == "identity":
        return data
    if encoding == "gzip":
        import gzip

        return gzip.decompress(data)
    if encoding == "lz4":
        import lz4.frame  # type: ignore[import-untyped]

        return bytes(lz4.frame.decompress(data))
    raise ValueError(f"unsupported Content-Encoding {encoding}")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self) -> None:
        self.do_POST()

    def do_POST(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        params = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        body = _decompress(self._body(), self.headers.get("Content-Encoding"))
        files: dict[str, bytes] = {}
        if self.headers.get("Content-Type", "").startswith("multipart/form-data"):
            message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n" + body)
            for part in message.iter_parts():
                name = part.get_param("name", header="content-disposition")
                payload = part.get_payload(decode=True)
                files[str(name)] = payload if isinstance(payload, bytes) else b""
            body = b""
        if "query" in params:
            sql, data = params["query"], body
        else:
            sql, data = body.decode("utf-8"), b""
        try:
            status, payload, fmt = 200, *self.server.run(sql, data, params, files)
        except Exception as exc:  # chdb's error: answered as ClickHouse answers, status 500
            status, payload, fmt = 500, (str(exc).strip() + "\n").encode(), "TabSeparated"
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("X-ClickHouse-Format", fmt)
        self.send_header("X-ClickHouse-Timezone", "UTC")
        self.send_header("X-ClickHouse-Summary", '{"read_rows":"0","written_rows":"0"}')
        if status != 200:
            code = re.search(r"Code: (\d+)", payload.decode(errors="replace"))
            self.send_header("X-ClickHouse-Exception-Code", code.group(1) if code else "1000")
        self.end_headers()
        self.wfile.write(payload)


class _Server(ThreadingHTTPServer):
    def __init__(self, session: Any, spool: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.session = session
        self.spool = spool
        self.lock = threading.Lock()
        self.requests = 0
        self._n = 0

    def _file(self, data: bytes) -> str:
        self._n += 1
        path = self.spool / f"body-{self._n}"
        path.write_bytes(data)
        return str(path)

    def run(self, sql: str, data: bytes, params: dict[str, str], files: dict[str, bytes]) -> tuple[bytes, str]:
        with self.lock:
            self.requests += 1
            s = self.session
            if params.get("database"):
                s.query(f"USE {params['database']}", "CSV")
            for name, value in params.items():
                if name in _NOT_SETTINGS or name.startswith(tuple(f"{f}_" for f in files)):
                    continue
                with suppress(Exception):  # a parameter that is no setting of this ClickHouse: ignored
                    s.query(f"SET {name} = '{value}'", "CSV")
            for name, content in files.items():
                fmt = params.get(f"{name}_format", "TabSeparated")
                structure = params.get(f"{name}_structure")
                source = f"file('{self._file(content)}', '{fmt}'" + (f", '{structure}')" if structure else ")")
                sql = re.sub(rf"\b{re.escape(name)}\b", source, sql)
            insert = _INSERT.match(sql)
            if insert and data:
                target, fmt = insert.groups()
                columns = re.match(r"(\S+)\s*(\(.*\))?\s*$", target.strip(), re.DOTALL)
                assert columns is not None
                s.query(f"INSERT INTO {target} SELECT * FROM file('{self._file(data)}', '{fmt}')", "CSV")
                return b"", "TabSeparated"
            found = _FORMAT.search(sql)
            fmt = found.group(1) if found else "TabSeparated"
            if found:
                sql = sql[:found.start()]
            return bytes(s.query(sql, fmt).bytes()), fmt


@contextmanager
def clickhouse_http(session: Any) -> Iterator[tuple[str, _Server]]:
    """Serve ClickHouse's HTTP interface for the chdb ``session`` on 127.0.0.1; yields ``(http://…, server)``."""
    spool = Path(tempfile.mkdtemp(prefix="llmslo-clickhouse-http-"))
    server = _Server(session, spool)
    thread = threading.Thread(target=server.serve_forever, name="clickhouse-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        shutil.rmtree(spool, ignore_errors=True)
