"""moto's server as an S3 endpoint, and a loopback proxy in front of it that
counts S3 calls and answers faults: for ``tests/test_attachment_storages.py``
and ``bench/purge_s3.py``.

``S3Server`` is the process ``harness.brokers`` starts for SQS (``python -m
moto.server`` on a free loopback port, in its own session, stopped with its
group): moto's server answers every AWS API, S3 included. ``S3Proxy`` listens
on another loopback port and forwards each request to it unchanged (real HTTP
both ways, bodies untouched), counting the operations it sees
(``DeleteObjects`` is ``POST /<bucket>?delete``) and, while ``fail`` says so,
answering the next requests of an operation itself with an S3 error
(``503 SlowDown``), as a throttled S3 does. moto checks no signatures, so the
requests signed for the proxy's address are accepted as they are.
"""

from __future__ import annotations

import http.client
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit
from xml.sax.saxutils import unescape

from harness.brokers import BrokerServer

ACCESS_KEY = "harness"
SECRET_KEY = "harness"  # noqa: S105 - moto checks no credentials: a dummy, as harness.brokers uses
REGION = "us-east-1"


class S3Server:
    """moto's server on a free loopback port; ``with`` or ``start()``/``stop()``."""

    def __init__(self) -> None:
        self._server = BrokerServer("sqs")  # the same moto server, which serves S3 too
        self.endpoint = ""

    def start(self) -> str:
        self._server.start()
        self.endpoint = f"http://127.0.0.1:{self._server.port}"
        return self.endpoint

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def s3_client(endpoint: str) -> Any:
    """A plain boto3 client of ``endpoint`` (to create buckets and list them)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )


def storage_options(endpoint: str, bucket: str) -> dict[str, Any]:
    """``STORAGES[alias]["OPTIONS"]`` of an ``S3Storage`` on ``bucket`` at ``endpoint``."""
    return {
        "bucket_name": bucket,
        "endpoint_url": endpoint,
        "access_key": ACCESS_KEY,
        "secret_key": SECRET_KEY,
        "region_name": REGION,
        "file_overwrite": True,
    }


def operation_of(method: str, target: str) -> str:
    """The S3 operation of a path-style request (what the proxy counts)."""
    parts = urlsplit(target)
    path = [p for p in parts.path.split("/") if p]
    query = parts.query
    if method == "POST" and "delete" in query.split("&"):
        return "DeleteObjects"
    if method == "DELETE":
        return "DeleteObject" if len(path) > 1 else "DeleteBucket"
    if method == "HEAD":
        return "HeadObject" if len(path) > 1 else "HeadBucket"
    if method == "PUT":
        return "PutObject" if len(path) > 1 else "CreateBucket"
    if method == "GET":
        return "GetObject" if len(path) > 1 else "ListObjects"
    return method


SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


# A ``DeleteObjects`` answer's ``<Deleted><Key>…</Key>…</Deleted>`` entries.
_DELETED = re.compile(r"<Deleted>\s*<Key>(.*?)</Key>", re.S)


def wall_clock() -> float:
    """The host's real time, even under a test's frozen clock. A store's log of
    deletions is read beside the database's commit times (``clock_timestamp()``,
    which ``time_machine`` cannot move); stamped with a frozen ``time.time()``
    every deletion would seem to precede the history it is checked against."""
    try:
        from time_machine import escape_hatch
    except ImportError:  # a bench run without the test requirements
        return time.time()
    # The escape hatch answers only while a clock is moved (else it raises).
    return escape_hatch.time.time() if escape_hatch.is_travelling() else time.time()


class S3Proxy:
    """A counting, fault-injecting HTTP proxy in front of ``upstream``."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.calls: Counter[str] = Counter()
        self.keys_per_delete_objects: list[int] = []
        # (key, wall_clock()) of each object moto deleted, as it answered: the
        # store's own log of deletions, for checks made in commit order.
        self.deleted: list[tuple[str, float]] = []
        self._faults: dict[str, int] = {}
        self._key_faults: dict[str, list[Any]] = {}  # key -> [error code, times left]
        self._late: dict[str, list[float]] = {}  # operation -> [seconds, times left]
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                return

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                operation = operation_of(self.command, self.path)
                with proxy._lock:
                    proxy.calls[operation] += 1
                    if operation == "DeleteObjects":
                        proxy.keys_per_delete_objects.append(body.count(b"<Key>"))
                    failing = proxy._faults.get(operation, 0)
                    if failing:
                        proxy._faults[operation] = failing - 1
                refused: list[tuple[str, str]] = []
                if operation == "DeleteObjects" and not failing:
                    body, refused = proxy._strip_refused(body)
                if failing:
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    self.wfile.write(SLOW_DOWN)
                    return
                upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=30)
                try:
                    dropped = ("connection", "content-length")
                    if refused:
                        # The body changed: its checksums no longer hold (moto checks none).
                        dropped += ("content-md5",)
                    headers = {
                        k: v
                        for k, v in self.headers.items()
                        if k.lower() not in dropped and not (refused and k.lower().startswith("x-amz-checksum"))
                    }
                    headers["Content-Length"] = str(len(body))
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    payload = answer.read()
                    if answer.status < 300:
                        proxy._log_deleted(operation, self.path, payload)
                    with proxy._lock:
                        late = proxy._late.get(operation)
                        pause = late[0] if late and late[1] > 0 else 0.0
                        if pause:
                            late[1] -= 1
                    if pause:
                        # Applied by moto, answered late: the client may have given up.
                        time.sleep(pause)
                    if refused:
                        errors = "".join(
                            f"<Error><Key>{key}</Key><Code>{code}</Code><Message>injected</Message></Error>"
                            for key, code in refused
                        )
                        payload = payload.replace(b"</DeleteResult>", errors.encode() + b"</DeleteResult>")
                    self.send_response(answer.status)
                    for key, value in answer.getheaders():
                        if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(key, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up (a timeout it was meant to hit)
                finally:
                    upstream.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        # shutdown() waits for serve_forever's next poll: 0.5 s by default, paid
        # by every test that stops a proxy.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="s3-proxy", daemon=True
        )

    def fail(self, operation: str, *, times: int) -> None:
        """Answer the next ``times`` requests of ``operation`` with ``503 SlowDown``."""
        with self._lock:
            self._faults[operation] = times

    def answer_late(self, operation: str, *, seconds: float, times: int = 1) -> None:
        """Forward the next ``times`` requests of ``operation`` (moto applies
        them), then wait ``seconds`` before answering."""
        with self._lock:
            self._late[operation] = [seconds, times]

    def fail_key(self, key: str, *, code: str, times: int = 1) -> None:
        """In the next ``times`` ``DeleteObjects`` naming ``key``, keep the key
        from moto and answer a per-key error ``code`` for it (``AccessDenied``,
        ``SlowDown``), as S3 does inside a 200 answer. Plain keys only (no XML
        escapes)."""
        with self._lock:
            self._key_faults[key] = [code, times]

    def _strip_refused(self, body: bytes) -> tuple[bytes, list[tuple[str, str]]]:
        refused = []
        with self._lock:
            for key, fault in self._key_faults.items():
                element = f"<Object><Key>{key}</Key></Object>".encode()
                if fault[1] > 0 and element in body:
                    body = body.replace(element, b"")
                    fault[1] -= 1
                    refused.append((key, str(fault[0])))
        return body, refused

    def _log_deleted(self, operation: str, target: str, payload: bytes) -> None:
        at = wall_clock()
        if operation == "DeleteObjects":
            found = _DELETED.findall(payload.decode())
            keys = [unescape(key, {"&quot;": '"', "&apos;": "'"}) for key in found]
        elif operation == "DeleteObject":
            keys = [unquote(urlsplit(target).path.split("/", 2)[2])]
        else:
            return
        with self._lock:
            self.deleted.extend((key, at) for key in keys)

    def reset(self) -> None:
        with self._lock:
            self.deleted.clear()
            self.calls.clear()
            self.keys_per_delete_objects.clear()
            self._faults.clear()
            self._key_faults.clear()
            self._late.clear()

    def start(self) -> str:
        self._thread.start()
        return self.endpoint

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> S3Proxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
