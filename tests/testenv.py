"""Test-only environment defaults, loaded as an early plugin (`-p tests.testenv`).

Loaded before Django's settings are imported, so the suite runs with
``DEBUG`` off (as production does) without anyone exporting a secret key.
"""

from __future__ import annotations

import os

os.environ.setdefault("SECRET_KEY", "test-only-secret-key-not-for-production-use-0123456789")
# The suite talks plain HTTP on loopback (test client, live server, browser).
for _name in ("SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE"):
    os.environ.setdefault(_name, "false")
# The browsable API is off in production unless API_BROWSABLE is set; the suite
# turns it on so the route crawler proves its pages and forms clean.
os.environ.setdefault("API_BROWSABLE", "true")
# The second schema (tests/schema_b): record kinds unlike the demo's, which the
# record-kind tests configure through RETENTION_RECORD_KINDS.
os.environ.setdefault("EXTRA_INSTALLED_APPS", "tests.schema_b")
