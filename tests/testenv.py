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
# Proofs are signed, and DEBUG is off here as in production: a fixed test key
# , so a failing proof reproduces byte for byte.
if "RETENTION_PROOF_SIGNING_KEY" not in os.environ:
    from cryptography.hazmat.primitives import serialization as _serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey as _Ed25519PrivateKey

    _test_key = _Ed25519PrivateKey.from_private_bytes(b"retention-cleanup test proof key")
    os.environ["RETENTION_PROOF_SIGNING_KEY"] = _test_key.private_bytes(
        _serialization.Encoding.PEM, _serialization.PrivateFormat.PKCS8, _serialization.NoEncryption()
    ).decode()
    os.environ.setdefault("RETENTION_PROOF_KEY_ID", "test-2026")
# The second schema (tests/schema_b): record kinds unlike the demo's, which the
# record-kind tests configure through RETENTION_RECORD_KINDS.
os.environ.setdefault("EXTRA_INSTALLED_APPS", "tests.schema_b")

# --- Hypothesis profiles --------------------------------------------------------------
# How many examples (and stateful steps) the property tests run is the profile's,
# never a test's: HYPOTHESIS_PROFILE=dev|ci|nightly, by default ci when CI=true
# (as .ci/run sets it), else dev. ci runs the sizes the suite has always run in CI;
# dev a fifth of them (the inner loop and a local `make test`); nightly ten times them.
# A test whose one example costs about as much as ``cost`` cheap ones asks for
# ``examples(cost=...)``: the profile's examples divided by that, at least one. A
# test's own fixed seed (``derandomize=True``) is kept in every profile.
from hypothesis import settings as _hypothesis_settings  # noqa: E402 - after the environment above

HYPOTHESIS_PROFILES = {
    # name: (examples of a cheap test, steps of a state machine)
    "dev": (100, 20),
    "ci": (500, 40),
    "nightly": (5000, 50),
}
for _profile, (_examples, _steps) in HYPOTHESIS_PROFILES.items():
    _hypothesis_settings.register_profile(
        _profile,
        max_examples=_examples,
        stateful_step_count=_steps,
        deadline=None,
        print_blob=True,
        derandomize=_profile == "ci",  # CI reproducible; dev and nightly explore
    )
HYPOTHESIS_PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev")
if HYPOTHESIS_PROFILE not in HYPOTHESIS_PROFILES:
    raise SystemExit(f"HYPOTHESIS_PROFILE={HYPOTHESIS_PROFILE!r}: expected one of {', '.join(HYPOTHESIS_PROFILES)}")
_hypothesis_settings.load_profile(HYPOTHESIS_PROFILE)


def examples(*, cost: int = 1) -> int:
    """The loaded profile's examples for a test whose one example costs about ``cost``
    cheap ones (a request through the stack, a transaction, a whole state machine run)."""
    return max(1, HYPOTHESIS_PROFILES[HYPOTHESIS_PROFILE][0] // cost)


def steps(*, share: float = 1.0) -> int:
    """The loaded profile's steps of a state machine, ``share`` of them (at least one)."""
    return max(1, round(HYPOTHESIS_PROFILES[HYPOTHESIS_PROFILE][1] * share))
