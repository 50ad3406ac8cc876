"""What may follow the store's base URL: a document id that is a plain identifier.

The base URL itself comes from settings only and is checked against the
allowlists by ``config.urlcheck`` (at start-up and before every client is
built). No URL or host ever comes from a payload, a record or a request: the
client only appends a document id that passes ``document_id_valid``.
"""

from __future__ import annotations

import re

DOCUMENT_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")


def document_id_valid(value: object) -> bool:
    return isinstance(value, str) and DOCUMENT_ID_RE.match(value) is not None
