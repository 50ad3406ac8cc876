"""DOWNSTREAM: removing deleted records' attachments from the document store.

- ``purge``: a purge job's slice (one HTTP DELETE per document, outside any
  transaction, each followed by a short fenced transaction moving the cursor).
- ``client``: the document store's HTTP client (httpx, explicit timeouts, no
  redirects, bodies never read).
- ``urls``: the destination allowlist and the document id rule.
"""
