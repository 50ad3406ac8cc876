"""The store's base URL, checked against the allowlists, and what may follow
it: a document id that is a plain identifier (pure standard library).

The base URL comes from settings only and is checked against the allowlists
by ``docstore_url_check``: at start-up (a system check, ``cleanup_ops.checks``)
and before every client is built (tests and operators may change settings at
run time; the allowlist still holds). No URL or host ever comes from a payload, a record or a request: the
client only appends a document id that passes ``document_id_valid``.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

DOCUMENT_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")


def document_id_valid(value: object) -> bool:
    return isinstance(value, str) and DOCUMENT_ID_RE.match(value) is not None


def docstore_url_check(url: str, *, schemes: list[str], hosts: list[str], name: str = "DOCSTORE_URL") -> str:
    """The base URL without a trailing slash, or ValueError naming ``name``."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # raises ValueError for a malformed port
    except ValueError:
        raise ValueError(f"{name}: not a valid URL: {url!r}") from None
    scheme = parts.scheme.lower()
    if scheme not in {s.lower() for s in schemes}:
        raise ValueError(f"{name}: scheme {scheme or '(none)'!r} is not in DOCSTORE_ALLOWED_SCHEMES {schemes}")
    host = (parts.hostname or "").lower()
    allowed = {h.strip().lower().strip("[]") for h in hosts if h.strip()}
    if not host or host not in allowed:
        raise ValueError(f"{name}: host {host or '(none)'!r} is not in DOCSTORE_ALLOWED_HOSTS {sorted(allowed)}")
    if parts.username or parts.password:
        raise ValueError(f"{name}: credentials in the URL are not allowed")
    if parts.query or parts.fragment:
        raise ValueError(f"{name}: a query or fragment is not allowed")
    if port == 0:
        raise ValueError(f"{name}: port 0 is not a destination")
    return url.strip().rstrip("/")
