"""The two customers the tenant isolation tests share, and the check that a
response holds no trace of the other.

Each customer's names carry a marker ("Alder", "Birch") and its portfolio,
property and records have distinctive ids, so a leak anywhere in a response
body — a filter choice, a search hit, a tenant name, an actor's username, a
pause reason — is a substring match.

The ``world`` fixture builds them (Alder and Birch, each with its staff,
policies, a version in review, a hold, a finished lease job, a dead letter
and a pause); each ``tests/test_tenant_isolation_*.py`` module takes it in
as ``world = tenant_world.world``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db.models import Q

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, LedgerEntry
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.recovery.operator import pipeline_pause
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease, MaintenanceRecord, Portfolio, Property, TenantActivity
from retention.models import AuditEvent, Membership, PolicyVersion, RetentionPolicy
from retention.services import legal_hold_place, membership_grant, policy_version_submit

from .conftest import make_user, utc

ROLES = ["property_manager", "compliance_reviewer", "auditor"]
OLD = utc("2020-01-01T00:00:00Z")


@dataclass
class Customer:
    marker: str  # in every name of this customer, lower-cased for matching
    portfolio: Portfolio
    prop: Property
    staff: dict[str, User]
    ids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.portfolio.pk

    def distinctive_ids(self) -> list[str]:
        """Ids chosen far from anything else in the test database."""
        return [str(self.pid), str(self.prop.pk), *(str(i) for i in self.ids["records"])]


def reject(job_id: int) -> None:
    raise DownstreamError(400)


def build_customer(name: str, *, base_id: int, active_policy: Any) -> Customer:
    marker = name.split()[0].lower()
    portfolio = Portfolio.objects.create(id=base_id, name=name, slug=marker)
    prop = Property.objects.create(id=base_id + 1, portfolio=portfolio, name=f"{name.split()[0]} Tower")
    staff = {role: make_user(f"{marker}-{role}") for role in ROLES}
    for role, user in staff.items():
        membership_grant(user=user, portfolio=portfolio, role=role, granted_by=None)
    active_policy(portfolio, "lease", 365)
    active_policy(portfolio, "maintenance_record", 365)
    common = {"portfolio_id": portfolio.pk, "property_id": prop.pk}
    leases = [
        Lease(id=base_id + 100 + i, **common, unit=f"{i}A", tenant_name=f"{name} tenant {i}", started_on=OLD.date())
        for i in range(3)
    ]
    for lease in leases:
        lease.ended_at = OLD  # expired: the sweep deletes these three
    # Still running: outlives the sweep, for the pages and checks that need a lease.
    leases.append(Lease(id=base_id + 103, **common, unit="9Z", tenant_name=f"{name} tenant 9", started_on=OLD.date()))
    Lease.objects.bulk_create(leases)
    MaintenanceRecord.objects.bulk_create(
        [
            MaintenanceRecord(id=base_id + 200 + i, **common, summary=f"{name} boiler", opened_at=OLD, closed_at=OLD)
            for i in range(2)
        ]
    )
    TenantActivity.objects.create(
        id=base_id + 300, **common, activity_type="login", details=f"{name} portal", occurred_at=OLD
    )
    customer = Customer(marker=marker, portfolio=portfolio, prop=prop, staff=staff)
    customer.ids.update(
        records=[*range(base_id + 100, base_id + 104), base_id + 200, base_id + 201, base_id + 300],
        running_lease=[base_id + 103],
        maintenance=[base_id + 200, base_id + 201],
        activity=[base_id + 300],
    )
    return customer


@pytest.fixture
def world(time_machine, operator_user, active_policy):  # type: ignore[no-untyped-def]
    """Customers Alder and Birch, each with its staff, policies, a version in
    review, a hold, a finished lease job (ledger rows), a dead letter, and a
    pause of its portfolio; the platform's staff see both."""
    time_machine.move_to("2026-08-21T02:05:00Z", tick=False)
    customers = {
        "alder": build_customer(
            "Alder Homes",
            base_id=730001,
            active_policy=active_policy,
        ),
        "birch": build_customer(
            "Birch Estates",
            base_id=840001,
            active_policy=active_policy,
        ),
    }
    sweep_trigger()
    for job in CleanupJob.objects.order_by("id"):
        job_run_slice(job_id=job.pk, before_batch=reject if job.record_kind == "maintenance_record" else None)
    for customer in customers.values():
        name = customer.portfolio.name
        policy = RetentionPolicy.objects.get(portfolio=customer.portfolio, record_kind="lease")
        version = policy_version_submit(
            policy=policy, retention_days=400, author=customer.staff["property_manager"], reason=f"{name} wants longer"
        )
        hold = legal_hold_place(
            portfolio=customer.portfolio,
            record_kind="tenant_activity",
            placed_by=customer.staff["compliance_reviewer"],
            reason=f"{name} litigation",
        )
        pipeline_pause(actor=operator_user, portfolio_id=customer.pid, reason=f"{name} incident review")
        customer.ids.update(
            policy=list(RetentionPolicy.objects.filter(portfolio=customer.portfolio).values_list("id", flat=True)),
            # The version in review first: the actions below use it.
            version=[
                version.pk,
                *PolicyVersion.objects.filter(policy__portfolio=customer.portfolio)
                .exclude(pk=version.pk)
                .values_list("id", flat=True),
            ],
            hold=[hold.pk],
            job=list(CleanupJob.objects.filter(portfolio_id=customer.pid).values_list("id", flat=True)),
            letter=list(DeadLetter.objects.filter(portfolio_id=customer.pid).values_list("id", flat=True)),
            event=list(
                AuditEvent.objects.filter(
                    Q(details__portfolio_id=customer.pid) | Q(object_type="portfolio", object_id=str(customer.pid))
                ).values_list("id", flat=True)
            ),
            membership=list(Membership.objects.filter(portfolio=customer.portfolio).values_list("id", flat=True)),
        )
    assert all(c.ids["letter"] and c.ids["job"] and c.ids["event"] for c in customers.values())
    assert LedgerEntry.objects.filter(portfolio_id=customers["birch"].pid).exists()
    return customers


def other_of(world: dict[str, Customer], key: str) -> Customer:
    return world["birch" if key == "alder" else "alder"]


def member(world: dict[str, Customer], key: str, role: str) -> User:
    return User.objects.get(username=f"{key}-{role}")  # fresh: no cached scope


def assert_no_trace(body: bytes | str, other: Customer, where: str, *, echo: tuple[str, ...] = ()) -> None:
    """``echo``: what the request itself sent (a search term, a filter value),
    which a page may show back in a form or a link, however encoded; removed
    before looking for anything else."""
    text = body.decode() if isinstance(body, bytes) else body
    for sent in echo:
        words = [re.escape(w) for w in re.split(r"[ =]", sent)]
        text = re.sub(r"(?:\s|\+|%2B|%20|=|%3D)*".join(words), "", text, flags=re.IGNORECASE)
    assert other.marker not in text.lower(), f"{where}: mentions {other.marker!r}"
    for value in other.distinctive_ids():
        assert value not in text, f"{where}: contains {other.marker}'s id {value}"
