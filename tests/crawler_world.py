"""The world the route crawler crawls, built once per test module that uses
it (module-scoped, rolled back at the end), and who crawls it.

- customer **a** has portfolios A1 and A2, customer **b** portfolio B; each
  has properties, records, policies, versions in review, a hold, a pause, a
  finished sweep job with ledger rows, a dead letter, audit events and staff;
- every row's id comes from a block of ids of its own (sequences moved to
  ``ID_BASE[table]``), so an id is a canary that cannot be confused with a
  count or another kind's id; names, reasons and usernames carry ``canary``
  strings, and the proof digests of b's jobs are canaries of b's sweep figures.

Each canary is tagged with the portfolio and the permission that reads it
(the rule a response is held to: ``tests/test_route_crawler.py``).

Users crawled: a's property manager, compliance reviewer and auditor (each a
member of A1 and A2), the mixed user, the cross-customer user
(``CUSTOMER_USERS``); the platform's superuser (``PLATFORM_USERS``) is
crawled for server errors only (they see everything). A module takes the
fixture in as ``world = crawler_world.world``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import Group, User
from django.db import connection, transaction
from django.db.models import Model

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, LedgerEntry, PipelinePause, Sweep
from cleanup_ops.proof import sweep_proof
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.recovery.operator import pipeline_pause
from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease, MaintenanceRecord, Portfolio, Property, TenantActivity
from retention.models import AuditEvent, LegalHold, Membership, PolicyVersion, RetentionPolicy
from retention.services import (
    legal_hold_place,
    membership_grant,
    policy_version_approve,
    policy_version_submit,
    retention_policy_get_or_create,
)

from .conftest import utc

OLD = utc("2020-01-01T00:00:00Z")
MISSING = 98765432  # no table has an id this large here
# Each table's ids start at its own block (see the module docstring).
ID_BASE: dict[type[Model], int] = {
    Portfolio: 11_000_000,
    Property: 12_000_000,
    Lease: 13_000_000,
    MaintenanceRecord: 14_000_000,
    TenantActivity: 15_000_000,
    RetentionPolicy: 16_000_000,
    PolicyVersion: 17_000_000,
    LegalHold: 18_000_000,
    AuditEvent: 19_000_000,
    Membership: 21_000_000,
    User: 22_000_000,
    Sweep: 23_000_000,
    CleanupJob: 24_000_000,
    DeadLetter: 25_000_000,
    LedgerEntry: 26_000_000,
    PipelinePause: 27_000_000,
}
VIEW = {
    model: f"{model._meta.app_label}.view_{model._meta.model_name}"
    for model in (
        Portfolio,
        Property,
        Lease,
        MaintenanceRecord,
        TenantActivity,
        RetentionPolicy,
        PolicyVersion,
        LegalHold,
        AuditEvent,
        CleanupJob,
        DeadLetter,
        LedgerEntry,
        Sweep,
    )
}
PORTFOLIO_VIEW = "properties.view_portfolio"
JOB_VIEW = "cleanup_ops.view_cleanupjob"
SWEEP_VIEW = "cleanup_ops.view_sweep"

CUSTOMER_USERS = ["a-manager", "a-reviewer", "a-auditor", "mixed", "cross"]
# The platform's superuser reaches every page (for server errors; it sees everything).
PLATFORM_USERS = ["superuser"]
METHODS = ("get", "head", "options")


# --- The world --------------------------------------------------------------------


@dataclass
class Canary:
    text: str
    portfolio_id: int
    perm: str
    is_id: bool = False


@dataclass
class World:
    portfolios: dict[str, Portfolio]
    ids: dict[type[Model], dict[str, int]] = field(default_factory=dict)  # model → {"A1"|"A2"|"B": id}
    canaries: list[Canary] = field(default_factory=list)
    users: dict[str, User] = field(default_factory=dict)

    def tag_ids(self, model: type[Model], perm: str, *, field_name: str = "portfolio_id") -> None:
        """Every row of ``model``: its id is a canary of its portfolio, and one
        row per portfolio is the id the crawler substitutes."""
        for key, portfolio in self.portfolios.items():
            rows = list(model._default_manager.filter(**{field_name: portfolio.pk}).order_by("pk"))
            for row in rows:
                self.canaries.append(Canary(str(row.pk), portfolio.pk, perm, is_id=True))
            if rows:
                self.ids.setdefault(model, {})[key] = rows[0].pk


def move_sequences() -> None:
    with connection.cursor() as cursor:
        for model, base in ID_BASE.items():
            table = model._meta.db_table
            cursor.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s, false)", [table, base + 1])


def staff(name: str, memberships: list[tuple[Portfolio, str]]) -> User:
    user = User.objects.create_user(username=name, password="pw-for-tests", is_staff=True)
    for portfolio, role in memberships:
        membership_grant(user=user, portfolio=portfolio, role=role, granted_by=None)
    return user


def reject(job_id: int) -> None:
    raise DownstreamError(400)


def build_world() -> World:
    move_sequences()
    operator = User.objects.create_user(username="platform-operator", password="pw-for-tests", is_staff=True)
    operator.groups.add(Group.objects.get(name="operator"))
    reviewer = User.objects.create_user(username="platform-reviewer", password="pw-for-tests", is_staff=True)
    reviewer.groups.add(Group.objects.get(name="compliance_reviewer"))
    superuser = User.objects.create_superuser(username="platform-root", password="pw-for-tests")
    portfolios = {
        "A1": Portfolio.objects.create(name="Alder Homes North", slug="alder-north"),
        "A2": Portfolio.objects.create(name="Alder Homes South canary-a2-portfolio", slug="alder-south"),
        "B": Portfolio.objects.create(name="Birch canary-b-portfolio", slug="birch"),
    }
    world = World(portfolios=portfolios)
    a1, a2, b = portfolios["A1"], portfolios["A2"], portfolios["B"]
    world.users = {
        "a-manager": staff("a-manager", [(a1, "property_manager"), (a2, "property_manager")]),
        "a-reviewer": staff("a-reviewer", [(a1, "compliance_reviewer"), (a2, "compliance_reviewer")]),
        "a-auditor": staff("a-auditor", [(a1, "auditor"), (a2, "auditor")]),
        "mixed": staff("mixed-a1-auditor-a2-manager", [(a1, "auditor"), (a2, "property_manager")]),
        "cross": staff("cross-a-auditor-b-manager", [(a1, "auditor"), (b, "property_manager")]),
        "operator": operator,
        "superuser": superuser,
    }
    b_staff = {
        role: staff(f"canary-b-{role}", [(b, role)]) for role in ("property_manager", "compliance_reviewer", "auditor")
    }
    a2_manager = world.users["a-manager"]
    for key, portfolio in portfolios.items():
        marker = f"canary-{key.lower()}"
        prop = Property.objects.create(portfolio=portfolio, name=f"{portfolio.slug} {marker}-property")
        common = {"portfolio_id": portfolio.pk, "property_id": prop.pk}
        Lease.objects.bulk_create(
            [
                *[
                    Lease(**common, unit=f"{i}A", tenant_name=f"{marker}-tenant", started_on=OLD.date(), ended_at=OLD)
                    for i in range(3)
                ],
                Lease(**common, unit="9Z", tenant_name=f"{marker}-tenant-running", started_on=OLD.date()),
            ]
        )
        MaintenanceRecord.objects.bulk_create(
            [MaintenanceRecord(**common, summary=f"{marker}-boiler", opened_at=OLD, closed_at=OLD) for _ in range(2)]
        )
        TenantActivity.objects.create(**common, activity_type="login", details=f"{marker}-portal", occurred_at=OLD)
        author = b_staff["property_manager"] if key == "B" else a2_manager
        approver = b_staff["compliance_reviewer"] if key == "B" else world.users["a-reviewer"]
        for kind in ("lease", "maintenance_record"):
            policy = retention_policy_get_or_create(portfolio=portfolio, record_kind=kind)
            version = policy_version_submit(
                policy=policy, retention_days=365, author=author, reason=f"{marker}-policy-reason"
            )
            policy_version_approve(version_id=version.pk, reviewer=approver, note=f"{marker}-review-note")
    sweep_trigger()
    for job in CleanupJob.objects.order_by("id"):
        job_run_slice(job_id=job.pk, before_batch=reject if job.record_kind == "maintenance_record" else None)
    for key, portfolio in portfolios.items():
        marker = f"canary-{key.lower()}"
        author = b_staff["property_manager"] if key == "B" else a2_manager
        placer = b_staff["compliance_reviewer"] if key == "B" else world.users["a-reviewer"]
        policy = RetentionPolicy.objects.get(portfolio=portfolio, record_kind="lease")
        policy_version_submit(policy=policy, retention_days=400, author=author, reason=f"{marker}-version-reason")
        legal_hold_place(
            portfolio=portfolio, record_kind="tenant_activity", placed_by=placer, reason=f"{marker}-hold-reason"
        )
        pipeline_pause(actor=operator, portfolio_id=portfolio.pk, reason=f"{marker}-pause-reason")

    sweep = Sweep.objects.get()
    world.ids[Sweep] = {"A1": sweep.pk}
    for model in (Lease, MaintenanceRecord, TenantActivity, RetentionPolicy, LegalHold, CleanupJob, DeadLetter):
        world.tag_ids(model, VIEW[model])
    world.tag_ids(Portfolio, PORTFOLIO_VIEW, field_name="pk")
    world.tag_ids(Property, VIEW[Property])
    world.tag_ids(PolicyVersion, VIEW[PolicyVersion], field_name="policy__portfolio_id")
    world.tag_ids(Membership, PORTFOLIO_VIEW)
    # A portfolio's pause shows in its audit trail (the event names its id).
    world.tag_ids(PipelinePause, VIEW[AuditEvent])
    for key, portfolio in portfolios.items():
        marker = f"canary-{key.lower()}"
        for event in AuditEvent.objects.filter(details__portfolio_id=portfolio.pk):
            world.canaries.append(Canary(str(event.pk), portfolio.pk, VIEW[AuditEvent], is_id=True))
        world.ids.setdefault(AuditEvent, {})[key] = (
            AuditEvent.objects.filter(details__portfolio_id=portfolio.pk).order_by("pk").first().pk
        )
        for entry in LedgerEntry.objects.filter(portfolio_id=portfolio.pk):
            world.canaries.append(Canary(entry.operation_id, portfolio.pk, VIEW[LedgerEntry]))
        proof = sweep_proof(sweep=sweep, portfolio_ids=frozenset({portfolio.pk}))
        for partition in proof["partitions"]:
            if partition["operations"]:  # a job without operations has the digest of nothing, shared by all
                world.canaries.append(Canary(partition["digest"], portfolio.pk, SWEEP_VIEW))
        if key != "A1":
            # Their texts: names, tenants, reasons, notes (all carry the marker).
            world.canaries.append(Canary(marker, portfolio.pk, PORTFOLIO_VIEW))
            # A portfolio's pause is in that portfolio's audit trail (its reason included).
            world.canaries.append(Canary(f"{marker}-pause-reason", portfolio.pk, VIEW[AuditEvent]))
    for user in b_staff.values():
        world.canaries.append(Canary(user.username, b.pk, PORTFOLIO_VIEW))
        world.canaries.append(Canary(str(user.pk), b.pk, PORTFOLIO_VIEW, is_id=True))
    world.ids[User] = {"A1": world.users["a-manager"].pk, "B": b_staff["property_manager"].pk}
    # The whole sweep's digest covers b's jobs: no customer user may see it.
    world.canaries.append(Canary(sweep_proof(sweep=sweep)["digest"], b.pk, "platform-only"))
    assert all(world.ids[m].keys() >= {"A1", "A2", "B"} for m in (CleanupJob, DeadLetter, LegalHold, PolicyVersion))
    return world


@pytest.fixture(scope="module")
def world(django_db_setup: None, django_db_blocker: Any) -> Iterator[World]:
    with time_machine.travel("2026-08-21T02:05:00Z", tick=False), django_db_blocker.unblock():
        with transaction.atomic():
            built = build_world()
            yield built
            transaction.set_rollback(True)
