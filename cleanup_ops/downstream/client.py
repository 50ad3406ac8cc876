"""HTTP client of the document store.

Why httpx (0.28, already a dependency) rather than requests: it takes an
explicit per-phase ``Timeout`` (connect, read, write, pool) instead of one
number, does not follow redirects unless asked (``follow_redirects=False`` is
still set explicitly here), and has a ``base_url`` so a request can only be a
path under the configured destination. Tests run against the real demo store
on loopback, so no mock transport is needed.

Rules this module enforces:

- The destination is ``settings.DOCSTORE_URL`` only, re-checked against
  ``DOCSTORE_ALLOWED_SCHEMES``/``DOCSTORE_ALLOWED_HOSTS`` whenever a client is
  built. Nothing from a payload, a record or a request can name a URL or host:
  a document id must match ``^[A-Za-z0-9_-]{1,64}$`` or no request is made.
- Every request carries an ``Idempotency-Key``.
- Response bodies are never read into logs, exceptions or the database: a
  failure becomes ``DownstreamError(status, retry_after)``,
  ``DownstreamTimeout`` or ``DownstreamConnectionError`` and is classified
  by ``cleanup_ops.recovery.classification`` like any other failure.
"""

from __future__ import annotations

import functools
import logging
import ssl
from types import TracebackType

import httpx
from django.conf import settings

from cleanup_ops.downstream.urls import docstore_url_check, document_id_valid
from cleanup_ops.recovery.classification import (
    DownstreamConnectionError,
    DownstreamError,
    DownstreamTimeout,
    InvalidInput,
    StaleDecision,
)

logger = logging.getLogger(__name__)

# The header that fences a delete: the instant (seconds since the epoch) after
# which the store must refuse it, because the decision's locks may be gone.
FENCE_DEADLINE = "Fence-Deadline"


class DocstoreNotConfigured(InvalidInput):
    """DOCSTORE_URL is empty: there is nowhere to send purges."""


class InvalidDocumentId(InvalidInput):
    """A document id that is not a plain identifier (a URL, a path, too long)."""


def docstore_base_url() -> str:
    if not settings.DOCSTORE_URL:
        raise DocstoreNotConfigured("DOCSTORE_URL is not set")
    try:
        return docstore_url_check(
            settings.DOCSTORE_URL, schemes=settings.DOCSTORE_ALLOWED_SCHEMES, hosts=settings.DOCSTORE_ALLOWED_HOSTS
        )
    except ValueError as exc:
        raise DocstoreNotConfigured(str(exc)) from None


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The TLS context every client of this process shares: httpx's default
    (certifi's roots; ``trust_env=False`` as the client, so no ``SSL_CERT_*``
    from the environment), verifying the certificate and the host name.

    Built once: loading the roots costs about 20 ms of CPU, and httpx builds a
    context for every client it makes, where a client is made per purge
    request. A root store changed on disk is read at the next start."""
    return httpx.create_ssl_context(trust_env=False)


class DocstoreClient:
    """A short-lived client (one per purge request); use as a context manager."""

    def __init__(self) -> None:
        timeout = httpx.Timeout(
            connect=settings.DOCSTORE_CONNECT_TIMEOUT,
            read=settings.DOCSTORE_READ_TIMEOUT,
            write=settings.DOCSTORE_READ_TIMEOUT,
            pool=settings.DOCSTORE_CONNECT_TIMEOUT,
        )
        self._http = httpx.Client(
            base_url=docstore_base_url(),
            timeout=timeout,
            follow_redirects=False,
            trust_env=False,  # no proxy or netrc from the environment: the destination is settings only
            verify=tls_context(),
            headers={"User-Agent": "retention-cleanup/1"},
        )

    def __enter__(self) -> DocstoreClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(
        self,
        method: str,
        document_id: str,
        *,
        idempotency_key: str,
        content: bytes | None = None,
        deadline: float | None = None,
    ) -> httpx.Response:
        if not document_id_valid(document_id):
            # Never interpolate it: it may be a URL or a path traversal.
            raise InvalidDocumentId("document id rejected")
        headers = {"Idempotency-Key": idempotency_key}
        if deadline is not None:
            headers[FENCE_DEADLINE] = f"{deadline:.3f}"
        try:
            response = self._http.request(method, f"/documents/{document_id}", headers=headers, content=content)
        except httpx.TimeoutException as exc:
            raise DownstreamTimeout(type(exc).__name__) from None
        except httpx.TransportError as exc:
            raise DownstreamConnectionError(type(exc).__name__) from None
        response.close()  # the body is never read
        logger.info("docstore %s %s -> %s", method, document_id, response.status_code)
        return response

    def delete_document(self, document_id: str, *, idempotency_key: str, deadline: float | None = None) -> str:
        """Delete one document: ``"deleted"``, or ``"absent"`` when it was already gone (404).

        ``deadline`` (seconds since the epoch, the database's clock) fences
        the call: the store applies it only until then, and answers 412 with
        ``Fence-Expired`` afterwards (``StaleDecision``, nothing applied).
        Any other answer raises ``DownstreamError`` (with ``Retry-After`` for
        429/503); ``DownstreamTimeout`` and ``DownstreamConnectionError`` when
        no answer came. Redirects (3xx) are not followed and raise too.
        """
        response = self._send("DELETE", document_id, idempotency_key=idempotency_key, deadline=deadline)
        status = response.status_code
        if status == 404:
            return "absent"
        if status == 412 and response.headers.get("Fence-Expired"):
            raise StaleDecision(document_id)
        if 200 <= status < 300:
            return "deleted"
        retry_after = response.headers.get("Retry-After")
        # The message class (the declared media type), never the body.
        content_type = response.headers.get("Content-Type")
        raise DownstreamError(status, retry_after[:100] if retry_after else None, content_type)

    def document_exists(self, document_id: str) -> bool:
        """Does the store still have the document? (``HEAD``; the body is never read.)"""
        response = self._send("HEAD", document_id, idempotency_key="exists")
        if response.status_code == 404:
            return False
        if 200 <= response.status_code < 300:
            return True
        retry_after = response.headers.get("Retry-After")
        raise DownstreamError(response.status_code, retry_after[:100] if retry_after else None)

    def put_document(self, document_id: str, content: bytes, *, idempotency_key: str) -> int:
        """Create or replace a document (demo seeding); returns the status."""
        response = self._send("PUT", document_id, idempotency_key=idempotency_key, content=content)
        if not 200 <= response.status_code < 300:
            raise DownstreamError(response.status_code, response.headers.get("Retry-After"))
        return response.status_code
