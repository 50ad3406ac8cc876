"""API tokens hashed at rest, with an expiry, listed and revoked by their owner — issue 39, item 4.

django-rest-knox's tokens (``cleanup_ops.api_tokens``): the database holds no
token in clear; an expired token and a revoked one answer 401; a user lists
only their own tokens (ids, never secrets) and cannot revoke another's (404,
as for an id that does not exist); the management command issues one with
an expiry and prints it once; DRF's clear-text tokens of an existing
installation are carried over hashed (the migration) and then deleted.
"""

from __future__ import annotations

import importlib
from datetime import timedelta
from io import StringIO

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from knox.crypto import hash_token
from knox.models import AuthToken
from rest_framework.test import APIClient

from cleanup_ops.api_tokens import api_token_issue, api_token_revoke
from retention.models import AuditEvent

from .conftest import make_user

pytestmark = pytest.mark.django_db


def client_with(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    return client


def database_text() -> str:
    """Every column of the token table and of the audit trail, as text."""
    with connection.cursor() as cur:
        cur.execute("SELECT coalesce(string_agg(t::text, ' '), '') FROM knox_authtoken t")
        (tokens,) = cur.fetchone()
        cur.execute("SELECT coalesce(string_agg(a::text, ' '), '') FROM retention_auditevent a")
        (audit,) = cur.fetchone()
    return tokens + " " + audit


def test_the_database_holds_no_token_in_clear():
    user = make_user("scripter", "operator")
    issued = api_token_issue(user=user)
    assert client_with(issued.secret).get("/api/v1/sweeps/").status_code == 200
    text = database_text()
    assert issued.token_id in text  # its id (the first characters) is stored, and audited
    assert issued.secret not in text
    assert issued.secret[len(issued.token_id) :] not in text  # nor the rest of it
    row = AuthToken.objects.get()
    assert row.digest == hash_token(issued.secret) and row.expiry is not None


def test_an_expired_token_answers_401(time_machine):
    user = make_user("scripter", "operator")
    issued = api_token_issue(user=user, ttl=timedelta(days=1))
    assert client_with(issued.secret).get("/api/v1/sweeps/").status_code == 200
    time_machine.move_to(timezone.now() + timedelta(days=1, seconds=1), tick=False)
    response = client_with(issued.secret).get("/api/v1/sweeps/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


def test_every_token_has_an_expiry_within_bounds():
    user = make_user("scripter", "operator")
    issued = api_token_issue(user=user)
    assert timedelta(days=89) < issued.expiry - timezone.now() <= timedelta(days=90)
    with pytest.raises(Exception, match="lifetime"):
        api_token_issue(user=user, ttl=timedelta(days=5000))


def test_a_revoked_token_answers_401_and_the_audit_trail_names_its_id_only():
    user = make_user("scripter", "operator")
    issued = api_token_issue(user=user)
    client = client_with(issued.secret)
    assert client.delete(f"/api/v1/tokens/{issued.token_id}/").status_code == 204
    assert client.get("/api/v1/sweeps/").status_code == 401
    events = AuditEvent.objects.filter(object_type="api_token").order_by("id")
    assert [(e.action, e.object_id) for e in events] == [
        ("api_token.issue", issued.token_id),
        ("api_token.revoke", issued.token_id),
    ]


def test_a_user_lists_only_their_own_tokens_and_cannot_revoke_anothers():
    mine, theirs = make_user("mine", "auditor"), make_user("theirs", "operator")
    first, second = api_token_issue(user=mine), api_token_issue(user=mine)
    other = api_token_issue(user=theirs)
    client = client_with(first.secret)
    listed = client.get("/api/v1/tokens/")
    assert listed.status_code == 200
    rows = listed.json()["results"]
    assert sorted(r["id"] for r in rows) == sorted([first.token_id, second.token_id])
    assert {r["id"]: r["current"] for r in rows} == {first.token_id: True, second.token_id: False}
    assert set(rows[0]) == {"id", "created", "expiry", "current"}
    body = listed.content.decode()
    assert first.secret not in body and second.secret not in body and other.token_id not in body
    # Another user's token answers as one that does not exist, and stays.
    assert client.delete(f"/api/v1/tokens/{other.token_id}/").status_code == 404
    assert client.delete("/api/v1/tokens/0123456789abcde/").status_code == 404
    assert client_with(other.secret).get("/api/v1/sweeps/").status_code == 200
    # The console's session reaches the same list.
    session = APIClient()
    session.force_login(theirs)
    assert [r["id"] for r in session.get("/api/v1/tokens/").json()["results"]] == [other.token_id]
    assert APIClient().get("/api/v1/tokens/").status_code == 401


def test_the_command_issues_lists_and_revokes():
    user = make_user("scheduler", "operator")
    out, err = StringIO(), StringIO()
    call_command("cleanup_api_token", "issue", "scheduler", "--days", "30", stdout=out, stderr=err)
    secret = out.getvalue().strip()
    token = AuthToken.objects.get(user=user)
    assert secret.startswith(token.token_key) and secret not in err.getvalue()
    assert timedelta(days=29) < token.expiry - timezone.now() <= timedelta(days=30)
    assert client_with(secret).get("/api/v1/sweeps/").status_code == 200
    listing = StringIO()
    call_command("cleanup_api_token", "list", "scheduler", stdout=listing)
    assert token.token_key in listing.getvalue() and secret not in listing.getvalue()
    call_command("cleanup_api_token", "revoke", "scheduler", token.token_key, stderr=StringIO())
    assert client_with(secret).get("/api/v1/sweeps/").status_code == 401
    with pytest.raises(Exception, match="--days: must be from 1 to 3650"):
        call_command("cleanup_api_token", "issue", "scheduler", "--days", "0")


def test_the_service_refuses_a_token_of_another_user():
    mine, theirs = make_user("mine", "auditor"), make_user("theirs", "operator")
    other = api_token_issue(user=theirs)
    with pytest.raises(Exception, match=other.token_id):
        api_token_revoke(user=mine, token_id=other.token_id)
    assert AuthToken.objects.filter(user=theirs).count() == 1


def test_the_migration_carries_drf_tokens_over_hashed_and_deletes_them():
    """An installation upgraded from DRF's tokens: the same secret still works, only its digest is kept."""
    user = make_user("scheduler", "operator")
    old_key = "0123456789abcdef0123456789abcdef01234567"  # DRF's: 40 hex digits
    with connection.cursor() as cur:
        cur.execute(
            'CREATE TABLE IF NOT EXISTS authtoken_token ("key" varchar(40) PRIMARY KEY, '
            "created timestamptz NOT NULL, user_id integer NOT NULL UNIQUE)"
        )
        cur.execute("INSERT INTO authtoken_token VALUES (%s, now(), %s)", [old_key, user.pk])
    migration = importlib.import_module("cleanup_ops.migrations.0023_api_tokens_to_knox")
    migration.carry_over(apps, connection.schema_editor())
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM authtoken_token")
        assert cur.fetchone()[0] == 0
    assert old_key not in database_text()
    token = AuthToken.objects.get(user=user)
    assert token.expiry is not None and token.expiry > timezone.now() + timedelta(days=89)
    assert client_with(old_key).get("/api/v1/sweeps/").status_code == 200


def test_the_admin_lists_ids_never_secrets_and_its_delete_revokes():
    from django.contrib.auth.models import User
    from django.test import Client

    user = make_user("scripter", "operator")
    issued = api_token_issue(user=user)
    staff = Client()
    staff.force_login(User.objects.create_superuser("root", password="pw-for-tests"))
    page = staff.get("/admin/knox/authtoken/").content.decode()
    digest = AuthToken.objects.get().digest
    # (The digest, the table's key, is in the row's links: a hash, not the token.)
    assert issued.token_id in page and issued.secret not in page
    assert staff.get("/admin/knox/authtoken/add/").status_code == 403
    response = staff.post(f"/admin/knox/authtoken/{digest}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert client_with(issued.secret).get("/api/v1/sweeps/").status_code == 401
    assert AuditEvent.objects.filter(action="api_token.revoke", object_id=issued.token_id).exists()
