"""The demo seeder: deterministic demo data (``seed_demo``) and attachments (``seed_attachments``).

Timestamps are spread backwards from midnight UTC of the current day, so two
runs with the same seed on the same day produce identical rows. The first
portfolio is as large as all the others together (skew), every portfolio gets
an approved policy per record kind, and a few legal holds at different scopes
keep part of the expired rows.

Users (password ``DEMO_PASSWORD``): ``reviewer``, ``operator`` and ``auditor``
are the platform's staff (groups; they see every portfolio). With one
customer (``customers=1``, the default) its property manager is ``manager``,
a member of every portfolio. With more, the portfolios are dealt round-robin
to customers ``a``, ``b``, …, each with its own staff — ``manager-a``,
``reviewer-a``, ``auditor-a`` — members of that customer's portfolios only;
each customer's baseline policies are authored by its manager and approved by
its reviewer (four-eyes within the customer).

To show four-eyes review itself, every customer also has a *lead*
(``lead`` with one customer, ``lead-a``, ``lead-b``, … with more) who holds
both an author role (property manager) and a reviewer role (compliance
reviewer) in the customer's portfolios: the lead may approve a version the
manager wrote, and the lead's own version waits for someone else — the admin
refuses to let its author review it. The lead authors nothing at seeding time.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.contrib.auth.models import Group, User
from django.db import transaction
from django.db.models import CharField, Value
from django.db.models.functions import Cast, Concat

from cleanup_ops.schedule import slot_current
from properties.models import Lease, MaintenanceRecord, Portfolio, Property
from properties.records import record_build
from retention.models import Membership
from retention.registry import REGISTRY
from retention.services import (
    legal_hold_place,
    membership_grant,
    policy_version_approve,
    policy_version_submit,
    retention_policy_get_or_create,
)

DEMO_PASSWORD = "demo-password-change-me"  # noqa: S105 - printed for the demo, never used in production
# Platform staff: a Django group each (see retention.roles.PLATFORM_GROUPS).
PLATFORM_USERS = {"compliance_reviewer": "reviewer", "operator": "operator", "auditor": "auditor"}
# The single customer's property manager (customers=1): a member, not a group.
SINGLE_CUSTOMER_MANAGER = "manager"
DEMO_USERS = {"property_manager": SINGLE_CUSTOMER_MANAGER, **PLATFORM_USERS}
# Each customer's author-and-reviewer (the four-eyes demo): lead, or lead-<letter>.
LEAD = "lead"
LEAD_ROLES = (Membership.Role.PROPERTY_MANAGER, Membership.Role.COMPLIANCE_REVIEWER)
# Each customer's staff when there are several: <role prefix>-<customer letter>.
CUSTOMER_STAFF = {
    Membership.Role.PROPERTY_MANAGER: "manager",
    Membership.Role.COMPLIANCE_REVIEWER: "reviewer",
    Membership.Role.AUDITOR: "auditor",
}
MAX_CUSTOMERS = 26
DEFAULT_RETENTION_DAYS = {"lease": 730, "maintenance_record": 365, "tenant_activity": 90}
BULK_SIZE = 5000

ProgressFn = Callable[[int, int], None]


@dataclass
class SeedResult:
    portfolios: int = 0
    properties: int = 0
    records: dict[str, int] = field(default_factory=dict)
    holds: int = 0
    users: list[str] = field(default_factory=list)
    # Customer letter → slugs of its portfolios (one customer: "a").
    customers: dict[str, list[str]] = field(default_factory=dict)


class SeedError(Exception):
    pass


def _demo_user(username: str, *groups: str) -> User:
    user = User.objects.create_user(username=username, password=DEMO_PASSWORD, is_staff=True)
    for group_name in groups:
        user.groups.add(Group.objects.get(name=group_name))
    return user


def _platform_users() -> dict[str, User]:
    return {group_name: _demo_user(username, group_name) for group_name, username in PLATFORM_USERS.items()}


def _customer_staff(customers: int) -> list[dict[str, User]]:
    """Per customer, its staff by membership role (memberships come with the portfolios)."""
    if customers == 1:
        return [{Membership.Role.PROPERTY_MANAGER: _demo_user(SINGLE_CUSTOMER_MANAGER)}]
    return [
        {role: _demo_user(f"{prefix}-{_letter(c)}") for role, prefix in CUSTOMER_STAFF.items()}
        for c in range(customers)
    ]


def _leads(customers: int) -> list[User]:
    """Per customer, the user with both an author and a reviewer role."""
    if customers == 1:
        return [_demo_user(LEAD)]
    return [_demo_user(f"{LEAD}-{_letter(c)}") for c in range(customers)]


def _letter(customer: int) -> str:
    return "abcdefghijklmnopqrstuvwxyz"[customer]


def demo_data_seed(
    *,
    portfolios: int,
    properties_per_portfolio: int,
    records_per_property: int,
    seed: int,
    customers: int = 1,
    progress: ProgressFn | None = None,
) -> SeedResult:
    if portfolios < 1:
        raise SeedError("--portfolios must be at least 1")
    if not 1 <= customers <= min(portfolios, MAX_CUSTOMERS):
        raise SeedError(f"--customers must be between 1 and --portfolios (at most {MAX_CUSTOMERS})")
    if properties_per_portfolio < 1:
        raise SeedError("--properties-per-portfolio must be at least 1")
    if records_per_property < 0:
        raise SeedError("--records-per-property must be 0 or more")
    usernames = [*DEMO_USERS.values(), LEAD] + [
        f"{p}-{_letter(c)}" for c in range(customers) for p in [*CUSTOMER_STAFF.values(), LEAD]
    ]
    if Portfolio.objects.exists() or User.objects.filter(username__in=usernames).exists():
        raise SeedError("the database already holds portfolios or demo users; seed_demo only fills an empty database")

    rng = random.Random(seed)
    # Ages count from the day of the sweep slot the demo's sweep will run for,
    # not from the clock: between midnight and the schedule's hour the slot is
    # still yesterday's, and the demo's figures would change with the hour.
    today = slot_current().replace(hour=0, minute=0, second=0, microsecond=0)
    result = SeedResult()
    skew = max(1, portfolios - 1)
    total_records = records_per_property * properties_per_portfolio * (skew + portfolios - 1)
    done = 0

    with transaction.atomic():
        users = _platform_users()
        staff = _customer_staff(customers)
        leads = _leads(customers)
        result.users = [user.username for user in [*users.values(), *(u for s in staff for u in s.values()), *leads]]
        for p_index in range(portfolios):
            portfolio = Portfolio.objects.create(name=f"Portfolio {p_index + 1}", slug=f"portfolio-{p_index + 1}")
            result.portfolios += 1
            # Round-robin, so the large first portfolio is one customer's among others.
            own_staff = staff[p_index % customers]
            result.customers.setdefault(_letter(p_index % customers), []).append(portfolio.slug)
            for role, member in own_staff.items():
                membership_grant(user=member, portfolio=portfolio, role=role, granted_by=None)
            for role in LEAD_ROLES:
                membership_grant(user=leads[p_index % customers], portfolio=portfolio, role=role, granted_by=None)
            # Four-eyes within the customer where it has a reviewer; else the platform's.
            reviewer = own_staff.get(Membership.Role.COMPLIANCE_REVIEWER, users["compliance_reviewer"])
            per_property = records_per_property * (skew if p_index == 0 else 1)
            for kind, days in DEFAULT_RETENTION_DAYS.items():
                policy = retention_policy_get_or_create(portfolio=portfolio, record_kind=kind)
                version = policy_version_submit(
                    policy=policy,
                    retention_days=days,
                    author=own_staff[Membership.Role.PROPERTY_MANAGER],
                    reason="Demo baseline policy",
                )
                policy_version_approve(version_id=version.pk, reviewer=reviewer, note="Demo: seeded, approved")
            for q_index in range(properties_per_portfolio):
                prop = Property.objects.create(portfolio=portfolio, name=f"P{p_index + 1}-Building {q_index + 1}")
                result.properties += 1
                rows = _make_records(rng, portfolio, prop, per_property, today)
                for kind, objs in rows.items():
                    model = REGISTRY[kind].model
                    for start in range(0, len(objs), BULK_SIZE):
                        chunk = objs[start : start + BULK_SIZE]
                        model.objects.bulk_create(chunk, batch_size=BULK_SIZE)
                        done += len(chunk)
                        result.records[kind] = result.records.get(kind, 0) + len(chunk)
                        if progress:
                            progress(done, total_records)
        result.holds = _place_demo_holds(rng, users["compliance_reviewer"])
    return result


def _make_records(
    rng: random.Random, portfolio: Portfolio, prop: Property, count: int, today: datetime
) -> dict[str, list]:
    rows: dict[str, list] = {kind: [] for kind in REGISTRY}
    kinds = list(REGISTRY)
    for i in range(count):
        kind = kinds[i % len(kinds)]
        # Ages up to three retention periods: about two thirds of every kind expire.
        age = timedelta(days=rng.randint(0, 3 * DEFAULT_RETENTION_DAYS[kind]), seconds=rng.randint(0, 86399))
        rows[kind].append(record_build(kind, portfolio_id=portfolio.pk, property_id=prop.pk, at=today - age, rng=rng))
    return rows


def _place_demo_holds(rng: random.Random, reviewer: User) -> int:
    """A property-wide hold, a kind-wide hold and a few single-record holds."""
    placed = 0
    first_property = Property.objects.order_by("id").first()
    if first_property is None:
        return 0
    legal_hold_place(
        portfolio=first_property.portfolio,
        property=first_property,
        placed_by=reviewer,
        reason="Demo: litigation over this building",
    )
    placed += 1
    second_portfolio = Portfolio.objects.order_by("id")[1:2].first()
    if second_portfolio is not None:
        legal_hold_place(
            portfolio=second_portfolio,
            record_kind="maintenance_record",
            placed_by=reviewer,
            reason="Demo: insurance claim covers all maintenance records",
        )
        placed += 1
    lease_ids = list(
        Lease.objects.exclude(property=first_property).order_by("id").values_list("id", "portfolio_id")[:200]
    )
    for lease_id, portfolio_id in rng.sample(lease_ids, k=min(3, len(lease_ids))):
        legal_hold_place(
            portfolio=Portfolio.objects.get(pk=portfolio_id),
            record_kind="lease",
            record_id=lease_id,
            placed_by=reviewer,
            reason="Demo: tenant dispute over this lease",
        )
        placed += 1
    return placed


def record_attachments_seed(*, fraction: float, seed: int, upload: Callable[[str], None] | None = None) -> list[str]:
    """Give a deterministic share of leases and maintenance records an attachment.

    Document ids are ``lease-<id>`` / ``maint-<id>``. ``upload`` (the store
    client) is called for every id first, outside any transaction; only then
    are the ids written to the records, in one short transaction. Returns the
    document ids.
    """
    if not 0 <= fraction <= 1:
        raise SeedError("--fraction must be between 0 and 1")
    rng = random.Random(seed)
    plan: list[tuple[type, str, list[int]]] = []
    for model, prefix in ((Lease, "lease"), (MaintenanceRecord, "maint")):
        ids = list(model.objects.filter(document_id__isnull=True).order_by("id").values_list("id", flat=True))
        plan.append((model, prefix, [record_id for record_id in ids if rng.random() < fraction]))
    document_ids = [f"{prefix}-{record_id}" for _, prefix, ids in plan for record_id in ids]
    if upload:
        for document_id in document_ids:
            upload(document_id)
    with transaction.atomic():
        for model, prefix, ids in plan:
            for start in range(0, len(ids), BULK_SIZE):
                model.objects.filter(id__in=ids[start : start + BULK_SIZE]).update(
                    document_id=Concat(Value(f"{prefix}-"), Cast("id", output_field=CharField()))
                )
    return document_ids


# --- The incident demo (``make demo-incident``) ---------------------------------

INCIDENT_PAUSE_REASON = "Customer asked to hold deletions during their own audit"


@dataclass
class IncidentResult:
    paused_portfolio: str = ""
    sweep_key: str = ""
    sweep_status: str = ""
    open_jobs: int = 0
    dead_letters: int = 0
    categories: dict[str, int] = field(default_factory=dict)


def demo_incident_stage(*, docstore_url: str, max_seconds: float = 60.0) -> IncidentResult:
    """After ``seed_demo`` and ``seed_attachments``: stage what an operator
    meets during an incident, so that the console has something to act on.

    - the last portfolio is paused (its jobs stay open: the sweep keeps
      running, and the forecast names the pause);
    - the document store rejects every delete (HTTP 400, its fault switch), so
      the purge jobs of the drain end as ``downstream_rejected`` dead letters;
    - a sweep is triggered and drained in this process (no worker cluster: the
      console says the open work waits for one).

    The store's fault is cleared at the end, so that a redrive from the
    console succeeds once the demo store is started again.
    """
    import json
    import urllib.request

    from cleanup_ops.execution.runner import cleanup_drain
    from cleanup_ops.models import CleanupJob, DeadLetter
    from cleanup_ops.recovery.operator import pipeline_pause
    from cleanup_ops.schedule import sweep_trigger

    def fault(method: str, body: dict[str, object] | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(  # noqa: S310 - the demo store on loopback
            f"{docstore_url.rstrip('/')}/_admin/faults", data=data, method=method
        )
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=5):  # noqa: S310
            pass

    paused = Portfolio.objects.order_by("-id").first()
    if paused is None:
        raise SeedError("no portfolio: run seed_demo first")
    pipeline_pause(actor=None, reason=INCIDENT_PAUSE_REASON, portfolio_id=paused.pk)
    fault("POST", {"status": 400})
    try:
        sweep = sweep_trigger().sweep
        cleanup_drain(max_seconds=max_seconds)
    finally:
        fault("DELETE")
    sweep.refresh_from_db()
    letters = DeadLetter.objects.open()
    categories: dict[str, int] = {}
    for category in letters.values_list("category", flat=True):
        categories[category] = categories.get(category, 0) + 1
    return IncidentResult(
        paused_portfolio=paused.name,
        sweep_key=sweep.key,
        sweep_status=sweep.status,
        open_jobs=CleanupJob.objects.open().count(),
        dead_letters=letters.count(),
        categories=categories,
    )
