from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import DatabaseError, connection, transaction

from retention.models import AppendOnlyError, AuditEvent
from retention.services import audit_event_record

pytestmark = pytest.mark.django_db


@pytest.fixture
def event(manager):
    return audit_event_record(actor=manager, action="test.action", object_type="thing", object_id=7, reason="why")


def test_an_audit_event_cannot_be_saved_again(event):
    event.reason = "rewritten"
    with pytest.raises(AppendOnlyError):
        event.save()
    assert AuditEvent.objects.get(pk=event.pk).reason == "why"


def test_an_audit_event_cannot_be_deleted_one_by_one_or_in_bulk(event):
    with pytest.raises(AppendOnlyError):
        event.delete()
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.all().delete()
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.filter(pk=event.pk).update(reason="x")
    assert AuditEvent.objects.filter(pk=event.pk, reason="why").exists()


def test_details_hold_identifiers_and_counts_only(manager):
    with pytest.raises(ValidationError):
        audit_event_record(
            actor=manager, action="x", object_type="t", object_id=1, details={"record": {"tenant_name": "Jane"}}
        )
    with pytest.raises(ValidationError):
        audit_event_record(actor=manager, action="x", object_type="t", object_id=1, details={"body": "x" * 500})
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE retention_auditevent SET reason = 'rewritten'",
        "DELETE FROM retention_auditevent",
    ],
)
def test_the_database_rejects_update_and_delete_on_postgres(event, sql):
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql)
    assert AuditEvent.objects.get(pk=event.pk).reason == "why"
