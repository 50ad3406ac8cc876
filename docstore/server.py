"""The demo document store: documents over HTTP, kept in its own SQLite file.

Stdlib only (``http.server.ThreadingHTTPServer`` + ``sqlite3``) so it starts in
a fraction of a second from a fresh clone, and it binds to loopback only.

Document endpoints (ids match ``^[A-Za-z0-9_-]{1,64}$``; anything else is 400):

- ``PUT /documents/<id>``: create (201) or replace (200); the body is the content.
- ``GET /documents/<id>``: 200 with the content, or 404.
- ``HEAD /documents/<id>``: 200 or 404, no body (does the store have it?).
- ``DELETE /documents/<id>``: needs an ``Idempotency-Key`` header (400 without).
  With ``Fence-Deadline: <seconds since the epoch>`` it is applied only if
  the store's clock has not passed that instant when it applies it; after
  that it answers 412 with ``Fence-Expired: true`` and applies nothing (the
  client's decision may no longer hold: its locks can be gone).
  The first request with a key is *applied*: 204 if the document existed and
  is now gone, 404 if there was nothing to delete. That status is stored under
  the key, and every later request with the same key gets it back without
  touching anything (``replayed`` in the log). A key reused for another path
  is 422. Failures (faults, 429) are not stored, so a retry is applied.

Rate limit: one token bucket (``--rate`` requests per second, ``--burst``)
over all document requests; when it is empty the store answers 429 with
``Retry-After`` in whole seconds (at least 1). ``--rate 0`` turns it off.

Faults, for demos and tests, set by flags at start or by
``POST /_admin/faults`` (JSON with the same names; ``DELETE /_admin/faults``
clears them). They apply to ``DELETE`` requests only:

- ``latency``: seconds slept before each request is handled;
- ``status``: answer this status (500, 503, 429, ...) instead of handling it,
  with ``retry_after`` as the ``Retry-After`` value: delta seconds (``"7"``), a
  literal HTTP-date, or ``"+N"`` for an HTTP-date N seconds from the store's clock;
- ``hang``: sleep this long, then answer 504 without applying anything;
- ``hang_after_apply``: apply the delete, then sleep this long before answering
  (a client with a shorter read timeout sees a timeout although the effect
  happened);
- ``redirect``: answer 307 with this ``Location``;
- ``content_type``: with ``status``, answer with this ``Content-Type`` and a
  short error body (which a client must never keep: tests look for it);
- ``count``: how many requests the fault applies to (0: until cleared).

Admin endpoints (loopback clients only): ``GET /_admin/requests`` (the request
log as JSON: method, path, key, time, status, replayed), ``GET
/_admin/documents`` (ids), ``POST /_admin/documents`` (JSON ``{"ids": [...]}``:
create those documents, no rate limit), ``POST /_admin/reset``.

Every document request is logged to the ``requests`` table (method, path,
idempotency key, arrival time, status, replayed) so tests can assert on
request times and counts. Bodies are never logged.
"""

from __future__ import annotations

import argparse
import email.utils
import ipaddress
import json
import re
import signal
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DOCUMENT_PATH = re.compile(r"^/documents/([A-Za-z0-9_-]{1,64})$")
MAX_BODY = 1 << 20
FAULT_NAMES = ("latency", "status", "retry_after", "hang", "hang_after_apply", "redirect", "content_type", "count")
# The body of a ``content_type`` fault's answer: a canary a client must never store.
FAULT_BODY = b'{"error": "docstore-fault-body-canary"}'

SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (id TEXT PRIMARY KEY, content BLOB NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS idempotency (
    key TEXT PRIMARY KEY, method TEXT NOT NULL, path TEXT NOT NULL, status INTEGER NOT NULL, applied_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY, at REAL NOT NULL, method TEXT NOT NULL, path TEXT NOT NULL,
    key TEXT NOT NULL DEFAULT '', status INTEGER NOT NULL, replayed INTEGER NOT NULL DEFAULT 0
);
"""


class Faults:
    """The current fault switches; thread-safe, consumed per request when ``count`` is set."""

    def __init__(self, **values: Any) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, Any] = {}
        self.set(values)

    def set(self, values: dict[str, Any]) -> dict[str, Any]:
        unknown = set(values) - set(FAULT_NAMES)
        if unknown:
            raise ValueError(f"unknown fault(s): {', '.join(sorted(unknown))}")
        clean = {k: v for k, v in values.items() if v not in (None, "", 0, 0.0)}
        with self._lock:
            self._values = clean
            return dict(self._values)

    def clear(self) -> None:
        self.set({})

    def take(self) -> dict[str, Any]:
        """The faults that apply to this request (and use one of ``count``)."""
        with self._lock:
            current = dict(self._values)
            if not current:
                return {}
            count = int(current.get("count") or 0)
            if count:
                if count == 1:
                    self._values = {}
                else:
                    self._values["count"] = count - 1
            return current


class Bucket:
    """An in-memory token bucket on the monotonic clock."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self.tokens = self.burst
        self.at = time.monotonic()
        self._lock = threading.Lock()

    def take(self) -> float:
        """0 when a token was taken; else seconds until one will be there."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens >= 1.0:
                self.tokens -= 1.0
                return 0.0
            return (1.0 - self.tokens) / self.rate


class Store:
    """The SQLite side: one connection behind a lock (a demo store, not a fast one)."""

    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def log(self, *, at: float, method: str, path: str, key: str, status: int, replayed: bool) -> None:
        with self._lock:
            self.db.execute(
                "INSERT INTO requests (at, method, path, key, status, replayed) VALUES (?, ?, ?, ?, ?, ?)",
                (at, method, path, key, status, int(replayed)),
            )

    def put(self, doc_id: str, content: bytes) -> int:
        with self._lock:
            existed = self.db.execute("SELECT 1 FROM documents WHERE id = ?", (doc_id,)).fetchone()
            self.db.execute(
                "INSERT INTO documents (id, content, created_at) VALUES (?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET content = excluded.content",
                (doc_id, content, time.time()),
            )
        return HTTPStatus.OK if existed else HTTPStatus.CREATED

    def get(self, doc_id: str) -> bytes | None:
        with self._lock:
            row = self.db.execute("SELECT content FROM documents WHERE id = ?", (doc_id,)).fetchone()
        return None if row is None else bytes(row[0])

    def replay(self, key: str) -> tuple[str, int] | None:
        with self._lock:
            row = self.db.execute("SELECT path, status FROM idempotency WHERE key = ?", (key,)).fetchone()
        return None if row is None else (row[0], int(row[1]))

    def delete(self, doc_id: str, *, key: str, path: str) -> tuple[int, bool]:
        """Apply a delete once per key: (status, replayed). One transaction."""
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                row = self.db.execute("SELECT path, status FROM idempotency WHERE key = ?", (key,)).fetchone()
                if row is not None:
                    self.db.execute("COMMIT")
                    if row[0] != path:
                        return HTTPStatus.UNPROCESSABLE_ENTITY, False
                    return int(row[1]), True
                gone = self.db.execute("DELETE FROM documents WHERE id = ?", (doc_id,)).rowcount
                status = HTTPStatus.NO_CONTENT if gone else HTTPStatus.NOT_FOUND
                self.db.execute(
                    "INSERT INTO idempotency (key, method, path, status, applied_at) VALUES (?, 'DELETE', ?, ?, ?)",
                    (key, path, int(status), time.time()),
                )
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
        return int(status), False

    def create_many(self, ids: list[str]) -> int:
        now = time.time()
        with self._lock:
            self.db.executemany(
                "INSERT INTO documents (id, content, created_at) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING",
                [(doc_id, b"demo document", now) for doc_id in ids],
            )
        return len(ids)

    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self.db.execute(
                "SELECT at, method, path, key, status, replayed FROM requests ORDER BY id"
            ).fetchall()
        return [
            {"at": r[0], "method": r[1], "path": r[2], "key": r[3], "status": r[4], "replayed": bool(r[5])}
            for r in rows
        ]

    def document_ids(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self.db.execute("SELECT id FROM documents ORDER BY id")]

    def reset(self) -> None:
        with self._lock:
            self.db.executescript("DELETE FROM documents; DELETE FROM idempotency; DELETE FROM requests;")


@dataclass
class Answer:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    replayed: bool = False
    applied: bool = False


class DocstoreServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], *, store: Store, bucket: Bucket, faults: Faults) -> None:
        super().__init__(address, Handler)
        self.store = store
        self.bucket = bucket
        self.faults = faults


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: DocstoreServer
    server_version = "docstore/1"

    def log_message(self, format: str, *args: Any) -> None:
        # The SQLite request log is the record; keep stderr quiet.
        return

    # --- plumbing -----------------------------------------------------------

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ValueError("body too large")
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            if body and not any(name.lower() == "content-type" for name in headers or {}):
                self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (its read timeout): the effect, if any, stands.
            self.close_connection = True

    def _json(self, status: int, payload: object) -> None:
        body = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _client_is_loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.client_address[0]).is_loopback
        except ValueError:
            return False

    # --- dispatch -----------------------------------------------------------

    def do_GET(self) -> None:
        self._route("GET")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_HEAD(self) -> None:
        self._route("HEAD")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def do_POST(self) -> None:
        self._route("POST")

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        if path.startswith("/_admin/"):
            self._admin(method, path)
            return
        arrived = time.time()
        key = (self.headers.get("Idempotency-Key") or "").strip()[:200]
        match = DOCUMENT_PATH.match(path)
        self._body_bytes = self._body()
        faults: dict[str, Any] = {}
        if match is None:
            answer = Answer(HTTPStatus.BAD_REQUEST if path.startswith("/documents/") else HTTPStatus.NOT_FOUND)
        else:
            faults = self.server.faults.take() if method == "DELETE" else {}
            answer = self._document(method, match.group(1), key, path, faults)
        # Logged when the outcome is decided, before any slow answer, so the
        # log order is the order in which effects happened.
        self.server.store.log(
            at=arrived, method=method, path=path, key=key, status=int(answer.status), replayed=answer.replayed
        )
        if faults.get("hang_after_apply") and answer.applied:
            time.sleep(float(faults["hang_after_apply"]))
        self._send(answer.status, answer.body, answer.headers)

    def _document(self, method: str, doc_id: str, key: str, path: str, faults: dict[str, Any]) -> Answer:
        store = self.server.store
        if faults.get("latency"):
            time.sleep(float(faults["latency"]))
        if faults.get("hang"):
            time.sleep(float(faults["hang"]))
            return Answer(HTTPStatus.GATEWAY_TIMEOUT)
        if faults.get("redirect"):
            return Answer(HTTPStatus.TEMPORARY_REDIRECT, headers={"Location": str(faults["redirect"])})
        if faults.get("status"):
            headers = {}
            if faults.get("retry_after"):
                headers["Retry-After"] = _retry_after_value(str(faults["retry_after"]))
            if faults.get("content_type"):
                headers["Content-Type"] = str(faults["content_type"])
                return Answer(int(faults["status"]), body=FAULT_BODY, headers=headers)
            return Answer(int(faults["status"]), headers=headers)
        wait = self.server.bucket.take()
        if wait > 0:
            return Answer(HTTPStatus.TOO_MANY_REQUESTS, headers={"Retry-After": str(max(1, int(wait + 0.999)))})
        if method in ("GET", "HEAD"):
            content = store.get(doc_id)
            return Answer(HTTPStatus.NOT_FOUND) if content is None else Answer(HTTPStatus.OK, content)
        if method == "PUT":
            return Answer(store.put(doc_id, self._body_bytes))
        if method == "DELETE":
            if not key:
                return Answer(HTTPStatus.BAD_REQUEST)
            deadline = self.headers.get("Fence-Deadline")
            if deadline is not None:
                try:
                    expired = time.time() > float(deadline)
                except ValueError:
                    return Answer(HTTPStatus.BAD_REQUEST)
                if expired:
                    # Not stored under the key: a retry under a fresh decision is applied.
                    return Answer(HTTPStatus.PRECONDITION_FAILED, headers={"Fence-Expired": "true"})
            status, replayed = store.delete(doc_id, key=key, path=path)
            headers = {"Idempotent-Replayed": "true"} if replayed else {}
            return Answer(status, headers=headers, replayed=replayed, applied=not replayed)
        return Answer(HTTPStatus.METHOD_NOT_ALLOWED)

    def _admin(self, method: str, path: str) -> None:
        if not self._client_is_loopback():
            self._send(HTTPStatus.FORBIDDEN)
            return
        store, faults = self.server.store, self.server.faults
        try:
            body = self._body()
            payload = json.loads(body) if body else {}
            if (method, path) == ("GET", "/_admin/requests"):
                self._json(HTTPStatus.OK, store.requests())
            elif (method, path) == ("GET", "/_admin/documents"):
                self._json(HTTPStatus.OK, store.document_ids())
            elif (method, path) == ("POST", "/_admin/documents"):
                ids = payload.get("ids", [])
                if not isinstance(ids, list) or not all(isinstance(i, str) and _valid_id(i) for i in ids):
                    self._json(HTTPStatus.BAD_REQUEST, {"error": "ids: a list of valid document ids"})
                    return
                self._json(HTTPStatus.OK, {"created": store.create_many(ids)})
            elif (method, path) == ("POST", "/_admin/faults"):
                self._json(HTTPStatus.OK, faults.set(payload))
            elif (method, path) == ("DELETE", "/_admin/faults"):
                faults.clear()
                self._json(HTTPStatus.OK, {})
            elif (method, path) == ("POST", "/_admin/reset"):
                store.reset()
                faults.clear()
                self._json(HTTPStatus.OK, {})
            else:
                self._send(HTTPStatus.NOT_FOUND)
        except (ValueError, TypeError) as exc:
            self._json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})


def _valid_id(doc_id: str) -> bool:
    return DOCUMENT_PATH.match(f"/documents/{doc_id}") is not None


def _retry_after_value(value: str) -> str:
    if value.startswith("+"):
        return email.utils.formatdate(time.time() + float(value[1:]), usegmt=True)
    return value


def _loopback_host(host: str) -> str:
    if host == "localhost":
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"--host: the demo store binds to loopback only, got {host!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="docstore", description="Demo HTTP document store on loopback.")
    parser.add_argument("--host", type=_loopback_host, default="127.0.0.1", help="loopback address to bind")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument("--db", default="var/docstore.sqlite3", help="SQLite file of the store")
    parser.add_argument("--rate", type=float, default=0.0, help="requests per second the store accepts (0: no limit)")
    parser.add_argument("--burst", type=float, default=10.0, help="bucket size of the store's rate limit")
    parser.add_argument("--latency", type=float, default=0.0, help="fault: seconds before each DELETE is handled")
    parser.add_argument("--fault-status", type=int, default=0, help="fault: answer DELETEs with this status")
    parser.add_argument("--fault-retry-after", default="", help='fault: Retry-After value ("7", an HTTP-date, "+7")')
    parser.add_argument("--fault-count", type=int, default=0, help="fault: apply to this many DELETEs (0: all)")
    return parser


def serve(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise SystemExit(f"--port: expected 0-65535, got {args.port}")
    if args.rate < 0 or args.burst < 1:
        raise SystemExit("--rate must be >= 0 and --burst >= 1")
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    faults = Faults(
        latency=args.latency, status=args.fault_status, retry_after=args.fault_retry_after, count=args.fault_count
    )
    server = DocstoreServer(
        (args.host, args.port), store=Store(args.db), bucket=Bucket(args.rate, args.burst), faults=faults
    )

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    host, port = server.server_address[:2]
    print(f"docstore listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    serve(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
