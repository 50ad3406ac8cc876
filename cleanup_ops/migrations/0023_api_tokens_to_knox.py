"""Carry DRF's clear-text API tokens over to knox's hashed ones, then delete them.

Before this release the API's tokens were ``rest_framework.authtoken``'s: the
``authtoken_token`` table held each token in clear, without an expiry. Each
one becomes a knox token (``knox.models.AuthToken``) holding only the digest
of the same secret and its first 15 characters, so a script or the
scheduler's trigger keeps working with the token it has; it expires
``API_TOKEN_TTL_DAYS`` after this migration (90 days unless set), by which
time it is to be re-issued (docs/operating.md, "API tokens"). The clear-text
rows are then deleted. Read with SQL: ``rest_framework.authtoken`` is no
longer an installed app, and a new installation has no such table at all.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import migrations
from django.utils import timezone


def carry_over(apps: Any, schema_editor: Any) -> None:
    from knox.crypto import hash_token
    from knox.settings import CONSTANTS

    connection = schema_editor.connection
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass('authtoken_token') IS NOT NULL")
        if not cur.fetchone()[0]:
            return
        cur.execute("SELECT key, user_id FROM authtoken_token")
        rows = cur.fetchall()
    token_model = apps.get_model("knox", "AuthToken")
    expiry = timezone.now() + timedelta(days=getattr(settings, "API_TOKEN_TTL_DAYS", 90))
    token_model.objects.bulk_create(
        [
            token_model(
                digest=hash_token(key), token_key=key[: CONSTANTS.TOKEN_KEY_LENGTH], user_id=user_id, expiry=expiry
            )
            for key, user_id in rows
        ],
        ignore_conflicts=True,
    )
    with connection.cursor() as cur:
        cur.execute("DELETE FROM authtoken_token")


class Migration(migrations.Migration):
    dependencies = [
        ("cleanup_ops", "0022_ledger_hash_chain"),
        ("knox", "0009_extend_authtoken_field"),
    ]

    operations = [migrations.RunPython(carry_over, migrations.RunPython.noop, elidable=False)]
