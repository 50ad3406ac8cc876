from __future__ import annotations

import pytest
import time_machine
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from properties.models import Lease, MaintenanceRecord, Portfolio, Property, TenantActivity
from retention.models import AuditEvent, LegalHold, PolicyVersion

from .conftest import utc

pytestmark = pytest.mark.django_db(transaction=True)

ARGS = ["--portfolios", "3", "--properties-per-portfolio", "2", "--records-per-property", "30"]


def snapshot() -> dict[str, list[tuple]]:
    def rows(model, *fields):
        return list(model.objects.order_by("id").values_list(*fields))

    return {
        "portfolios": rows(Portfolio, "name", "slug"),
        "properties": rows(Property, "portfolio__slug", "name"),
        "leases": rows(Lease, "property__name", "unit", "tenant_name", "started_on", "ended_at"),
        "maintenance": rows(MaintenanceRecord, "property__name", "summary", "opened_at", "closed_at"),
        "activities": rows(TenantActivity, "property__name", "activity_type", "occurred_at"),
        "policies": rows(PolicyVersion, "policy__portfolio__slug", "policy__record_kind", "retention_days", "status"),
        "holds": rows(LegalHold, "portfolio__slug", "property__name", "record_kind", "reason"),
    }


def wipe() -> None:
    # Audit events are append-only for the application; a test database reset
    # is the only place that removes them, through the raw flush (which puts the
    # migration's role groups back: tests/conftest.py).
    call_command("flush", "--noinput", verbosity=0)


@time_machine.travel("2026-08-21T02:00:00Z", tick=False)
def test_the_same_seed_gives_the_same_data():
    call_command("seed_demo", *ARGS, "--seed", "7", stdout=open("/dev/null", "w"))
    first = snapshot()
    wipe()
    call_command("seed_demo", *ARGS, "--seed", "7", stdout=open("/dev/null", "w"))
    assert snapshot() == first
    wipe()
    call_command("seed_demo", *ARGS, "--seed", "8", stdout=open("/dev/null", "w"))
    assert snapshot()["leases"] != first["leases"]


@time_machine.travel("2026-08-21T02:00:00Z", tick=False)
def test_seed_demo_is_skewed_has_policies_holds_users_and_expired_rows():
    call_command("seed_demo", *ARGS, "--seed", "1", stdout=open("/dev/null", "w"))
    per_portfolio = {
        p.slug: Lease.objects.filter(portfolio=p).count()
        + MaintenanceRecord.objects.filter(portfolio=p).count()
        + TenantActivity.objects.filter(portfolio=p).count()
        for p in Portfolio.objects.all()
    }
    assert per_portfolio == {"portfolio-1": 120, "portfolio-2": 60, "portfolio-3": 60}
    assert PolicyVersion.objects.filter(status="approved").count() == 9
    assert LegalHold.objects.filter(property__isnull=False).exists()
    assert LegalHold.objects.exclude(record_kind="").filter(record_id__isnull=True).exists()
    assert LegalHold.objects.filter(record_id__isnull=False).exists()
    assert set(User.objects.values_list("username", flat=True)) == {
        "manager",
        "reviewer",
        "operator",
        "auditor",
        "lead",
    }
    assert Lease.objects.filter(ended_at__lt=utc("2024-08-21T00:00:00Z")).exists()
    assert Lease.objects.filter(ended_at__gt=utc("2025-08-21T00:00:00Z")).exists()


def test_seed_demo_refuses_a_database_that_already_has_portfolios_and_writes_nothing():
    Portfolio.objects.create(name="Existing", slug="existing")
    with pytest.raises(CommandError, match="already holds portfolios"):
        call_command("seed_demo", *ARGS, stdout=open("/dev/null", "w"))
    assert Portfolio.objects.count() == 1
    assert not AuditEvent.objects.exists()


def test_seed_demo_rejects_bad_sizes_naming_the_flag():
    with pytest.raises(CommandError, match="--portfolios"):
        call_command("seed_demo", "--portfolios", "0", stdout=open("/dev/null", "w"))
    assert not Portfolio.objects.exists()
