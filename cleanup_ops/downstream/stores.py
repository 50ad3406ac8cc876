"""Attachment stores: where a purge sends its deletes, behind one interface.

Two backends (``store_for``):

- ``DocstoreStore``: the HTTP document store at ``DOCSTORE_URL`` (the demo's
  ``docstore/server.py``), through ``DocstoreClient``. A kind without
  ``"storage"`` in its attachment uses it. It is **fenced**: every DELETE
  carries ``Fence-Deadline`` and the store refuses one that arrives after it
  (412, ``StaleDecision``). Document ids keep their strict rule
  (``^[A-Za-z0-9_-]{1,64}$``), one document per call, with an
  ``Idempotency-Key``.
- ``StorageStore`` and its S3 form ``S3Store``: any Django storage in
  ``settings.STORAGES[alias]`` (a kind with ``"attachment": {"field": …,
  "storage": alias}``). The file system (``FileSystemStorage``) and any other
  storage go through the storage API (``exists``, ``delete``); an
  ``S3Storage`` of django-storages gets a boto3 client of its own, built from
  the storage's settings with bounded timeouts
  (``STORAGE_PURGE_CONNECT_TIMEOUT``, ``STORAGE_PURGE_READ_TIMEOUT``) and
  **no botocore retries** (``total_max_attempts = 1``: the product retries,
  with its backoff and its budgets), and deletes up to 1,000 keys per
  ``DeleteObjects`` call (``STORAGE_PURGE_BATCH_SIZE``). These stores are
  **not fenced**: they cannot refuse a late call, so the purge starts a call
  only while its decision's locks are sure to outlive the call's
  client-side bound (``call_bound_seconds``; ``downstream.fencing``).

What a purge asks a store, and what the answers mean:

- ``key_problem(key)``: why a key cannot be purged (too long for the store,
  blank, refused by the storage's own name rules), or None. Checked when the
  batch writes its outbox: a key with a problem is never sent; its record is
  named in the request's ``unpurgeable`` list and the purge ends as a dead
  letter naming the kind and the record id.
- ``delete(keys)``: one call for up to ``max_keys`` keys; a ``KeyResult``
  per key, in order: ``deleted``, ``absent`` (the store says it had no such
  file: HTTP 404), ``refused`` (a per-key error that is the store's final
  word, e.g. ``AccessDenied``: the key's record becomes unpurgeable) or
  ``failed`` (a per-key error worth retrying, e.g. ``SlowDown`` or
  ``InternalError`` inside a ``DeleteObjects`` answer, with the exception the
  purge raises once the keys before it are recorded). An S3 DELETE of a
  missing key succeeds: S3 cannot say "absent" on a delete, so a deleted key
  counts as purged; where the protocol needs to know whether the file is
  there (before recording a set-aside, after a call whose effect is unknown)
  it asks ``exists`` (``HEAD``). A failure of the whole call raises, like the
  HTTP client: ``DownstreamError(status, retry_after)`` (S3's ``SlowDown`` and
  the throttling codes are 503 or 429, a rate signal with backoff,
  ``recovery.classification``), ``DownstreamTimeout``,
  ``DownstreamConnectionError``.
- ``exists(key)``: does the store still have the file?
- ``canonical(key)``: the name the storage will act on, for a key with no
  ``key_problem`` — a file's identity. Two spellings of one object
  (``contracts//a.pdf`` and ``contracts/a.pdf``, ``a/../b`` and ``b``) are
  one document to every check of the purge only if they are compared in
  this form (issue 37).

A purge's document reference (``DeletedAttachment.document_id``,
``DocumentDisposition.document_id``, ``PurgeRequest.document_ids``) is the
HTTP document id as it is, or ``<alias>:<canonical key>`` for a storage
(``document_ref`` over ``canonical``): the same key in two storages is two
documents, and an HTTP id (no ``:``) is never one of a storage. A storage's
canonical key is, per ``name_rule``: on S3 the bucket key relative to the
storage's ``location`` (django-storages' ``clean_name`` and
``_normalize_name``, exactly as its own ``delete`` applies them); on the file
system the path ``storage.path()`` resolves to, relative to the storage's
``location``; on any other storage the key as the record spells it. The same
rules are a PostgreSQL function (``cleanup_ops_storage_name``, migration
``0020``), which the reference guard applies to the keys the application
writes; ``tests/test_storage_names.py`` proves the two agree. Keys are at
most ``STORAGE_KEY_MAX_BYTES`` (S3's limit, 1,024 bytes of UTF-8). Nothing a
store answers beyond a status and an error code is read: never a body, never
a file's contents.
"""

from __future__ import annotations

import logging
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from types import TracebackType
from typing import Any

from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.core.files.storage import FileSystemStorage, Storage, storages

from cleanup_ops.downstream.client import DocstoreClient
from cleanup_ops.downstream.urls import document_id_valid
from cleanup_ops.models import STORAGE_KEY_MAX_BYTES
from cleanup_ops.recovery.classification import (
    DownstreamConnectionError,
    DownstreamError,
    DownstreamTimeout,
    InvalidInput,
)

logger = logging.getLogger(__name__)

# ``PurgeRequest.store`` of the HTTP document store.
DOCSTORE = ""
# DeleteObjects takes at most this many keys.
S3_MAX_KEYS = 1000

# Whole-call or per-key S3 error codes that are a rate signal (like 429/503).
THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "BandwidthLimitExceeded",
    }
)
# Per-key codes worth retrying (the store's trouble, not the key's).
TRANSIENT_CODES = THROTTLE_CODES | {"InternalError", "ServiceUnavailable", "RequestTimeout", "OperationAborted"}

# How a store names its files (``AttachmentStore.name_rule``), for the SQL
# twin of ``canonical`` (``cleanup_ops_storage_name``): the key as it is, S3's
# rules, the file system's.
RULE_EXACT = "exact"
RULE_S3 = "s3"
RULE_FILE_SYSTEM = "file_system"

DELETED = "deleted"
ABSENT = "absent"
REFUSED = "refused"
FAILED = "failed"


class UnknownStore(InvalidInput):
    """A purge request names a storage alias that is not in ``STORAGES``."""


@dataclass(frozen=True)
class KeyResult:
    """What one call did to one key (``effect``: deleted, absent, refused, failed)."""

    effect: str
    code: str = ""  # the store's error code for refused/failed (an identifier, never a message)
    error: BaseException | None = None  # for failed: what the purge raises


def document_ref(store: str, key: str) -> str:
    """The purge's reference of ``key`` in ``store`` (``DOCSTORE``: the id itself)."""
    return f"{store}:{key}" if store else key


def ref_key(store: str, ref: str) -> str:
    """The store's key of a reference made by ``document_ref``."""
    if not store:
        return ref
    prefix = f"{store}:"
    if not ref.startswith(prefix):
        raise InvalidInput("document reference of another store")
    return ref[len(prefix) :]


class AttachmentStore(ABC):
    """One purge slice's connection to a store; use as a context manager."""

    # Honours ``Fence-Deadline`` (refuses a call that arrives late).
    fenced: bool = False
    # Keys one ``delete`` call may take.
    max_keys: int = 1

    def __enter__(self) -> AttachmentStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:  # noqa: B027 - most stores hold nothing to close
        """Release what the store holds (connections)."""

    @abstractmethod
    def call_bound_seconds(self) -> float:
        """The longest one call can take under the client's timeouts."""

    @abstractmethod
    def key_problem(self, key: object) -> str | None:
        """Why ``key`` cannot be purged (a short category), or None."""

    @abstractmethod
    def delete(
        self, keys: list[str], *, idempotency_keys: list[str] | None = None, deadline: float | None = None
    ) -> list[KeyResult]:
        """One call deleting ``keys`` (at most ``max_keys``): a result per key, in order."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Does the store still have the file?"""

    def canonical(self, key: str) -> str:
        """The name of ``key``'s file as the store will act on it: equal for
        two keys exactly when the store would act on one file. Only for a key
        with no ``key_problem``."""
        return key

    def name_rule(self) -> tuple[str, str]:
        """(rule, location) of ``canonical``, for its SQL twin."""
        return RULE_EXACT, ""


class DocstoreStore(AttachmentStore):
    """The HTTP document store (``DocstoreClient``): fenced, one document per call."""

    fenced = True
    max_keys = 1

    def __init__(self) -> None:
        self._client = DocstoreClient()

    def close(self) -> None:
        self._client.close()

    def call_bound_seconds(self) -> float:
        # Pool, connect, write, two reads (httpx's phases).
        return 2 * settings.DOCSTORE_CONNECT_TIMEOUT + 3 * settings.DOCSTORE_READ_TIMEOUT

    def key_problem(self, key: object) -> str | None:
        return key_checker(DOCSTORE)(key)

    def delete(
        self, keys: list[str], *, idempotency_keys: list[str] | None = None, deadline: float | None = None
    ) -> list[KeyResult]:
        (key,) = keys
        (idempotency,) = idempotency_keys or [f"delete:{key}"]
        return [KeyResult(self._client.delete_document(key, idempotency_key=idempotency, deadline=deadline))]

    def exists(self, key: str) -> bool:
        return self._client.document_exists(key)


def _storage_key_problem(key: object) -> str | None:
    if not isinstance(key, str) or not key.strip():
        return "empty"
    if len(key.encode("utf-8", errors="surrogatepass")) > STORAGE_KEY_MAX_BYTES:
        return "too_long"
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        return "control_character"
    return None


class StorageStore(AttachmentStore):
    """Any Django storage, through its API: one ``delete`` per key (the file
    system's ``unlink``). Not fenced. ``exists`` before a delete tells
    ``absent`` from ``deleted`` (the storage API's ``delete`` of a missing
    file does nothing and says nothing)."""

    fenced = False

    def __init__(self, alias: str, storage: Storage) -> None:
        self.alias = alias
        self.storage = storage
        self.max_keys = settings.STORAGE_PURGE_BATCH_SIZE

    def call_bound_seconds(self) -> float:
        # The storage API has no timeout of its own: the read timeout is the
        # bound a purge assumes (docs/architecture.md says what that leaves open).
        return settings.STORAGE_PURGE_CONNECT_TIMEOUT + settings.STORAGE_PURGE_READ_TIMEOUT

    def key_problem(self, key: object) -> str | None:
        problem = _storage_key_problem(key)
        if problem:
            return problem
        try:
            self._name_check(str(key))
        except (SuspiciousOperation, ValueError):
            # Path traversal, an absolute path, a name the storage will not map.
            return "refused_by_storage"
        return None

    def _name_check(self, key: str) -> None:
        self.canonical(key)

    @cached_property
    def _file_system(self) -> bool:
        # A storage whose ``path`` maps names to files under ``location``
        # (FileSystemStorage and its subclasses): its names have a canonical
        # form. Another storage's names are taken as they are spelled.
        return isinstance(self.storage, FileSystemStorage)

    def canonical(self, key: str) -> str:
        """The file system: the file ``storage.path(key)`` resolves to
        (``safe_join``: ``//``, ``.`` and ``..`` segments and a trailing slash
        gone; ``SuspiciousFileOperation`` outside the location), relative to
        the storage's location. A name that resolves to the location itself
        names no file (``ValueError``). Any other storage: the key as it is."""
        if not self._file_system:
            path = getattr(self.storage, "path", None)
            if path is not None:
                try:
                    path(key)  # its own name rules refuse what they refuse
                except NotImplementedError:
                    pass
            return key
        storage: Any = self.storage  # a FileSystemStorage: its ``location``
        resolved = str(storage.path(key))
        name = resolved[len(str(storage.location)) :].lstrip("/")
        if not name:
            raise ValueError("the name resolves to the storage's location")
        return name

    def name_rule(self) -> tuple[str, str]:
        if self._file_system:
            storage: Any = self.storage
            return RULE_FILE_SYSTEM, str(storage.location)
        return RULE_EXACT, ""

    def delete(
        self, keys: list[str], *, idempotency_keys: list[str] | None = None, deadline: float | None = None
    ) -> list[KeyResult]:
        results = []
        for key in keys:
            try:
                if not self.storage.exists(key):
                    results.append(KeyResult(ABSENT))
                    continue
                self.storage.delete(key)
            except PermissionError:
                results.append(KeyResult(REFUSED, "PermissionDenied"))
            except (SuspiciousOperation, ValueError):
                results.append(KeyResult(REFUSED, "SuspiciousName"))
            except OSError as exc:
                results.append(KeyResult(FAILED, type(exc).__name__, DownstreamConnectionError(type(exc).__name__)))
            else:
                results.append(KeyResult(DELETED))
        return results

    def exists(self, key: str) -> bool:
        try:
            return bool(self.storage.exists(key))
        except OSError as exc:
            raise DownstreamConnectionError(type(exc).__name__) from None


_S3_SESSIONS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_S3_SESSIONS_LOCK = threading.Lock()


def s3_client(storage: Any, **options: Any) -> Any:
    """A new boto3 S3 client (``options`` as ``Session.client``'s) from the
    session of an ``S3Storage`` (its own ``_create_session``: its keys or
    profile), which is made once per storage object of this process.

    A purge request builds its own client (our timeouts, no retries), and a
    client built from a new session loads botocore's service models from disk
    again: about 75 ms of CPU per request, against 15 from a session that has
    loaded them. A session is not thread-safe, so clients are made from it
    under a lock; the client itself is. The storage object is the key, so a
    storage rebuilt (``STORAGES`` changed) gets a session of its own."""
    with _S3_SESSIONS_LOCK:
        session = _S3_SESSIONS.get(storage)
        if session is None:
            session = _S3_SESSIONS[storage] = storage._create_session()
        return session.client("s3", **options)


class S3Store(StorageStore):
    """An ``S3Storage`` of django-storages: its bucket, its ``location`` and
    credentials, through a boto3 client of our own with bounded timeouts and
    no botocore retries; ``DeleteObjects`` for up to 1,000 keys a call."""

    storage: Any  # django-storages' S3Storage (no stubs): its session, region, endpoint and name rules

    def __init__(self, alias: str, storage: Any) -> None:
        super().__init__(alias, storage)
        from botocore.config import Config

        self.max_keys = min(settings.STORAGE_PURGE_BATCH_SIZE, S3_MAX_KEYS)
        ours = Config(
            connect_timeout=settings.STORAGE_PURGE_CONNECT_TIMEOUT,
            read_timeout=settings.STORAGE_PURGE_READ_TIMEOUT,
            # One attempt: a retry is the product's decision (backoff, budgets,
            # and a fresh purge decision under fresh locks), never botocore's.
            retries={"total_max_attempts": 1, "mode": "standard"},
        )
        base = getattr(storage, "client_config", None)
        self._config = base.merge(ours) if base is not None else ours
        self.bucket = storage.bucket_name

    @cached_property
    def _client(self) -> Any:
        # Built on first use: checking a key needs no connection.
        storage = self.storage
        return s3_client(
            storage,
            region_name=storage.region_name,
            use_ssl=storage.use_ssl,
            endpoint_url=storage.endpoint_url,
            config=self._config,
            verify=storage.verify,
        )

    def close(self) -> None:
        if "_client" in self.__dict__:
            self._client.close()

    def call_bound_seconds(self) -> float:
        # Connect, send the request, read the answer (urllib3 applies the read
        # timeout to each socket operation after the connection), plus a margin.
        return settings.STORAGE_PURGE_CONNECT_TIMEOUT + 2 * settings.STORAGE_PURGE_READ_TIMEOUT + 1.0

    def canonical(self, key: str) -> str:
        """The bucket key of ``key`` (``object_key``) relative to the
        storage's ``location``: one name per object for a given location.
        (Not ``clean_name(key)`` alone: ``_normalize_name`` then resolves
        ``..`` segments a backslash spelled and a leading ``/``, so
        ``a\\..\\b`` and ``/b`` are the object ``b`` too.) A name that
        resolves to the location itself names no object (``ValueError``)."""
        object_key = self.object_key(key)
        base = str(self.storage.location).rstrip("/")
        # django-storages refuses a location with a leading slash (check_location),
        # so the bucket key of a name under it starts with ``<base>/``.
        name = object_key[len(base) + 1 :] if base else object_key
        if not name:
            raise ValueError("the name resolves to the storage's location")
        return name

    def name_rule(self) -> tuple[str, str]:
        return RULE_S3, str(self.storage.location)

    def object_key(self, key: str) -> str:
        """The bucket's key of a storage name: the storage's ``location`` and
        name rules applied exactly as its own ``delete`` applies them
        (``SuspiciousOperation`` for a name outside the location)."""
        from storages.utils import clean_name

        object_key = self.storage._normalize_name(clean_name(key))
        if not object_key or len(object_key.encode("utf-8", errors="surrogatepass")) > STORAGE_KEY_MAX_BYTES:
            raise ValueError("object key empty or too long")
        return str(object_key)

    def delete(
        self, keys: list[str], *, idempotency_keys: list[str] | None = None, deadline: float | None = None
    ) -> list[KeyResult]:
        by_object: dict[str, list[int]] = {}
        results: list[KeyResult | None] = [None] * len(keys)
        for i, key in enumerate(keys):
            try:
                by_object.setdefault(self.object_key(key), []).append(i)
            except (SuspiciousOperation, ValueError):
                results[i] = KeyResult(REFUSED, "SuspiciousName")
        if by_object:
            answer = self._call(
                "delete_objects",
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in by_object], "Quiet": False},
            )
            for deleted in answer.get("Deleted", []):
                for i in by_object.get(str(deleted.get("Key")), []):
                    results[i] = KeyResult(DELETED)
            for error in answer.get("Errors", []):
                code = _code_of(error.get("Code"))
                for i in by_object.get(str(error.get("Key")), []):
                    if code in TRANSIENT_CODES:
                        status = 503 if code in THROTTLE_CODES else 500
                        results[i] = KeyResult(FAILED, code, DownstreamError(status))
                    else:
                        results[i] = KeyResult(REFUSED, code)
        # A key the answer does not mention: its effect is unknown.
        return [r if r is not None else KeyResult(FAILED, "NoAnswer", DownstreamTimeout("NoAnswer")) for r in results]

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            object_key = self.object_key(key)
        except (SuspiciousOperation, ValueError):
            return False
        try:
            self._call("head_object", Bucket=self.bucket, Key=object_key, _raw=True)
        except ClientError as exc:
            if _status_of(exc) == 404:
                return False
            raise _mapped(exc) from None
        return True

    def _call(self, operation: str, _raw: bool = False, **kwargs: Any) -> dict[str, Any]:
        """One S3 call; botocore's failures as the product's exceptions
        (``_raw``: a ``ClientError`` is left to the caller)."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            ConnectTimeoutError,
            ReadTimeoutError,
        )

        try:
            answer: dict[str, Any] = getattr(self._client, operation)(**kwargs)
        except ClientError as exc:
            if _raw:
                raise
            raise _mapped(exc) from None
        except (ConnectTimeoutError, ReadTimeoutError) as exc:
            raise DownstreamTimeout(type(exc).__name__) from None
        except ConnectionError as exc:
            raise DownstreamConnectionError(type(exc).__name__) from None
        except BotoCoreError as exc:
            raise DownstreamConnectionError(type(exc).__name__) from None
        logger.info("storage %s %s -> %s", self.alias, operation, _answer_status(answer))
        return answer


def _code_of(value: object) -> str:
    """An error code as an identifier (letters and digits, at most 64), never a message."""
    text = str(value or "")
    return text if text.isalnum() and len(text) <= 64 else "Unknown"


def _status_of(exc: Any) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _answer_status(answer: dict[str, Any]) -> int:
    return int(answer.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _mapped(exc: Any) -> DownstreamError:
    """A ``ClientError`` as the HTTP store's: its status (throttling codes as
    503, or 429 when S3 said so) and ``Retry-After`` when sent. Never the message."""
    code = _code_of(exc.response.get("Error", {}).get("Code"))
    status = _status_of(exc)
    headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}) or {}
    retry_after = headers.get("retry-after")
    if code in THROTTLE_CODES and status not in (429, 503):
        status = 503
    return DownstreamError(status or 500, str(retry_after)[:100] if retry_after else None, headers.get("content-type"))


def store_for(store: str) -> AttachmentStore:
    """The store of a purge request (``PurgeRequest.store``): the HTTP
    document store for ``DOCSTORE``, else the Django storage of that alias."""
    if not store:
        return DocstoreStore()
    return storage_store(store)


def storage_store(alias: str) -> StorageStore:
    if alias not in (getattr(settings, "STORAGES", None) or {}):
        raise UnknownStore(f"STORAGES has no alias {alias!r}")
    storage = storages[alias]
    if _is_s3(storage):
        return S3Store(alias, storage)
    return StorageStore(alias, storage)


def key_canonicaliser(store: str) -> Callable[[str], str]:
    """``canonical`` for the outbox, opening no connection: the HTTP id as it
    is, or the storage's canonical name of a key with no ``key_problem``."""
    if not store:
        return lambda key: key
    return storage_store(store).canonical


def key_checker(store: str) -> Callable[[object], str | None]:
    """A ``key_problem`` for the outbox, opening no connection: the HTTP id
    rule, or the storage's (length, blank, its own name rules)."""
    if not store:
        return lambda key: None if document_id_valid(key) else "invalid_id"
    return storage_store(store).key_problem


def _is_s3(storage: Storage) -> bool:
    try:
        from storages.backends.s3 import S3Storage
    except ImportError:
        return False
    return isinstance(storage, S3Storage)
