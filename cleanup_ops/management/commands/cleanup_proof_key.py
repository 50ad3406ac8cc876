"""Print the public keys proofs of disposition are signed with (or make a new private key).

The default output is the key set JSON ``/api/v1/proof-keys/`` serves: save it
and give it to ``cleanup_proof_verify --public-key``. ``--pem`` prints the
current public key alone. ``--generate`` prints a new Ed25519 private key
(PEM) to standard output for ``RETENTION_PROOF_SIGNING_KEY``; it is written
nowhere else, and never logged.
"""

from __future__ import annotations

import json
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management.base import BaseCommand, CommandError, CommandParser

from cleanup_ops.proof_keys import ProofKeyMissing, proof_key_set, proof_signing_key


class Command(BaseCommand):
    help = (
        "Print the proof signing public key set (JSON, as /api/v1/proof-keys/ serves it); "
        "--pem: the current public key as PEM; --generate: a new private key for RETENTION_PROOF_SIGNING_KEY."
    )
    # --generate must work before a key is set (the check would only warn, but needs no database either).
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--pem", action="store_true", help="the current public key alone, as PEM")
        group.add_argument("--generate", action="store_true", help="print a new Ed25519 private key (PEM)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["generate"]:
            pem = Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            self.stdout.write(pem.decode(), ending="")
            return
        if options["pem"]:
            try:
                key = proof_signing_key()
            except ProofKeyMissing as exc:
                raise CommandError(str(exc)) from None
            pem = key.public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            self.stdout.write(pem.decode(), ending="")
            return
        key_set = proof_key_set()
        if not key_set["keys"]:
            raise CommandError("no proof signing key is configured (RETENTION_PROOF_SIGNING_KEY), and none retired")
        self.stdout.write(json.dumps(key_set, indent=2))
