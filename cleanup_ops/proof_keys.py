"""The keys that sign proofs of disposition, and the public key set the platform publishes.

Settings (``cleanup_ops.defaults``; the demo project reads them from the
environment):

- ``RETENTION_PROOF_SIGNING_KEY``: the Ed25519 private key, as PEM (PKCS#8,
  unencrypted) or the path of a file holding it.
- ``RETENTION_PROOF_KEY_ID``: the id every signature names; empty means the
  public key's fingerprint (``ed25519-<16 hex>``, what a verifier given a
  bare PEM public key calls it).
- ``RETENTION_PROOF_PUBLIC_KEYS``: the path of a key set JSON (the shape
  ``proof_key_set`` returns) of keys rotated out, published beside the current
  one so the proofs they signed still verify.

Rotation: make a new key, move the old one's entry (``manage.py
cleanup_proof_key``'s output) into the retired key set, set the new key and
id. A proof names its key id; a verifier holds the whole published set.

With no key configured and DEBUG on (the demo, local work), proofs are signed
with a fixed demo key derived from a public label: key id ``demo-insecure``,
and the published entry says ``"demo": true``. Anyone can make that key; a
proof it signed proves nothing. With DEBUG off and no key, a proof export is
refused (``ProofKeyMissing``: the console and the API answer 503 naming the
setting) rather than served unsigned or demo-signed; every ``manage.py``
command warns (system check W120) and ``manage.py check --deploy`` fails
(system check E121). A key that is set but unreadable is an error at
start-up (the demo project's settings) and system check E120.
Nothing here writes a private key to a log or a response.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings

from cleanup_ops.proof_verify import KEY_ID, SIGNATURE_ALGORITHM, key_fingerprint, public_keys_load

DEMO_KEY_ID = "demo-insecure"
# Public on purpose: the demo key is for showing the flow, never for evidence.
_DEMO_SEED_LABEL = b"retention-cleanup demo proof signing key; not a secret; proves nothing"


class ProofKeyMissing(Exception):
    """Proofs were asked for with DEBUG off and no RETENTION_PROOF_SIGNING_KEY."""


@dataclass(frozen=True)
class SigningKey:
    key_id: str
    private: Ed25519PrivateKey
    demo: bool = False

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()


def private_key_parse(value: str) -> Ed25519PrivateKey:
    """A PEM private key, given as its text or as a file's path; ValueError saying why not (never the key)."""
    text = value.strip()
    if not text.startswith("-----BEGIN"):
        path = Path(text)
        if not path.is_file():
            raise ValueError("expected a PEM private key or the path of a file holding one; no such file")
        text = path.read_text(encoding="utf-8").strip()
    try:
        key = serialization.load_pem_private_key(text.encode(), password=None)
    except (ValueError, TypeError) as exc:
        # The library's message names the format, never the key's bytes.
        raise ValueError(f"not a readable unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"expected an Ed25519 key, got {type(key).__name__}")
    return key


def demo_key() -> SigningKey:
    seed = hashlib.sha256(_DEMO_SEED_LABEL).digest()
    return SigningKey(DEMO_KEY_ID, Ed25519PrivateKey.from_private_bytes(seed), demo=True)


def proof_signing_key() -> SigningKey:
    """The key proofs are signed with now (``ProofKeyMissing`` when there is none)."""
    configured = settings.RETENTION_PROOF_SIGNING_KEY
    if not configured:
        if settings.DEBUG:
            return demo_key()
        raise ProofKeyMissing(
            "RETENTION_PROOF_SIGNING_KEY is not set: proofs of disposition are signed, and DEBUG is off "
            "(docs/operating.md, 'Proof signing keys')"
        )
    return _configured_key(configured, settings.RETENTION_PROOF_KEY_ID)


def _configured_key(value: str, key_id: str) -> SigningKey:
    private = private_key_parse(value)
    return SigningKey(key_id or key_fingerprint(private.public_key()), private)


def retired_public_keys() -> dict[str, Ed25519PublicKey]:
    path = settings.RETENTION_PROOF_PUBLIC_KEYS
    if not path:
        return {}
    return public_keys_load(Path(path).read_text(encoding="utf-8"))


def key_entry(*, key_id: str, key: Ed25519PublicKey, current: bool, demo: bool) -> dict[str, Any]:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return {
        "key_id": key_id,
        "algorithm": SIGNATURE_ALGORITHM,
        "public_key": base64.b64encode(raw).decode(),
        "public_key_pem": pem.decode(),
        "fingerprint": key_fingerprint(key),
        "current": current,
        "demo": demo,
    }


def proof_key_set() -> dict[str, Any]:
    """The public keys a verifier needs (``/api/v1/proof-keys/``, ``manage.py cleanup_proof_key``):
    the current one first, then every retired one. The file this returns, saved as JSON, is
    what ``cleanup_proof_verify --public-key`` reads."""
    keys: list[dict[str, Any]] = []
    try:
        current: SigningKey | None = proof_signing_key()
    except ProofKeyMissing:
        current = None
    if current is not None:
        keys.append(key_entry(key_id=current.key_id, key=current.public, current=True, demo=current.demo))
    for key_id, key in retired_public_keys().items():
        if current is None or key_id != current.key_id:
            keys.append(key_entry(key_id=key_id, key=key, current=False, demo=False))
    return {"algorithm": SIGNATURE_ALGORITHM, "keys": keys}


def proof_public_keys() -> dict[str, Ed25519PublicKey]:
    """The published set as a verifier holds it, by key id."""
    return public_keys_load(json.dumps(proof_key_set()))


def signing_settings_problems() -> list[tuple[str, str]]:
    """(setting, what is wrong) for each proof key setting that breaks its rule; never the key itself."""
    problems: list[tuple[str, str]] = []
    key_id = settings.RETENTION_PROOF_KEY_ID
    if not isinstance(key_id, str) or (key_id and not KEY_ID.match(key_id)):
        problems.append(("RETENTION_PROOF_KEY_ID", "expected 1 to 64 of A-Z a-z 0-9 . _ : -"))
    elif key_id == DEMO_KEY_ID:
        problems.append(("RETENTION_PROOF_KEY_ID", f"{DEMO_KEY_ID!r} is the demo key's id"))
    value = settings.RETENTION_PROOF_SIGNING_KEY
    if not isinstance(value, str):
        problems.append(("RETENTION_PROOF_SIGNING_KEY", "expected PEM text or a file path"))
    elif value:
        try:
            private_key_parse(value)
        except (ValueError, OSError) as exc:
            problems.append(("RETENTION_PROOF_SIGNING_KEY", str(exc)))
    retired = settings.RETENTION_PROOF_PUBLIC_KEYS
    if not isinstance(retired, str):
        problems.append(("RETENTION_PROOF_PUBLIC_KEYS", "expected a file path or an empty string"))
    elif retired:
        try:
            retired_public_keys()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(("RETENTION_PROOF_PUBLIC_KEYS", f"not a readable key set ({exc})"))
    return problems
