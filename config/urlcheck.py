"""The demo project's start-up check of ``DOCSTORE_URL`` (pure standard library).

``config/settings.py`` calls it while it reads the environment, so a bad
``DOCSTORE_URL`` stops the process naming the variable. It is a copy of the
app's ``cleanup_ops.downstream.urls.docstore_url_check`` (which the system
check and the store client use) because the settings import no app;
``tests/test_installable.py`` keeps the two the same.
"""

from __future__ import annotations

from urllib.parse import urlsplit


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
