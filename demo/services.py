"""The demo seeder: deterministic demo data (``seed_demo``) and attachments (``seed_attachments``).

Timestamps are spread backwards from midnight UTC of the current day, so two
runs with the same seed on the same day produce identical rows. The first
portfolio is as large as all the others together (skew), every portfolio gets
an approved policy per record kind, and a few legal holds at different scopes
keep part of the expired rows.
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
from django.utils import timezone

from properties.models import Lease, MaintenanceRecord, Portfolio, Property, TenantActivity
from retention.registry import REGISTRY
from retention.services import (
    legal_hold_place,
    policy_version_approve,
    policy_version_submit,
    retention_policy_get_or_create,
)

DEMO_PASSWORD = "demo-password-change-me"  # noqa: S105 - printed for the demo, never used in production
DEMO_USERS = {
    "property_manager": "manager",
    "compliance_reviewer": "reviewer",
    "operator": "operator",
    "auditor": "auditor",
}
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


class SeedError(Exception):
    pass


def _demo_users() -> dict[str, User]:
    users = {}
    for group_name, username in DEMO_USERS.items():
        user = User.objects.create_user(username=username, password=DEMO_PASSWORD, is_staff=True)
        user.groups.add(Group.objects.get(name=group_name))
        users[group_name] = user
    return users


def demo_data_seed(
    *,
    portfolios: int,
    properties_per_portfolio: int,
    records_per_property: int,
    seed: int,
    progress: ProgressFn | None = None,
) -> SeedResult:
    if portfolios < 1:
        raise SeedError("--portfolios must be at least 1")
    if properties_per_portfolio < 1:
        raise SeedError("--properties-per-portfolio must be at least 1")
    if records_per_property < 0:
        raise SeedError("--records-per-property must be 0 or more")
    if Portfolio.objects.exists() or User.objects.filter(username__in=DEMO_USERS.values()).exists():
        raise SeedError("the database already holds portfolios or demo users; seed_demo only fills an empty database")

    rng = random.Random(seed)
    today = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    result = SeedResult()
    skew = max(1, portfolios - 1)
    total_records = records_per_property * properties_per_portfolio * (skew + portfolios - 1)
    done = 0

    with transaction.atomic():
        users = _demo_users()
        result.users = list(DEMO_USERS.values())
        for p_index in range(portfolios):
            portfolio = Portfolio.objects.create(name=f"Portfolio {p_index + 1}", slug=f"portfolio-{p_index + 1}")
            result.portfolios += 1
            per_property = records_per_property * (skew if p_index == 0 else 1)
            for kind, days in DEFAULT_RETENTION_DAYS.items():
                policy = retention_policy_get_or_create(portfolio=portfolio, record_kind=kind)
                version = policy_version_submit(
                    policy=policy, retention_days=days, author=users["property_manager"], reason="Demo baseline policy"
                )
                policy_version_approve(version_id=version.pk, reviewer=users["compliance_reviewer"], note="Demo")
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
        at = today - age
        common = {"portfolio_id": portfolio.pk, "property_id": prop.pk}
        if kind == "lease":
            running = rng.random() < 0.1
            rows[kind].append(
                Lease(
                    **common,
                    unit=f"{rng.randint(1, 40)}{rng.choice('ABCD')}",
                    tenant_name=f"Tenant {rng.randint(1000, 9999)}",
                    started_on=(at - timedelta(days=365)).date(),
                    ended_on=None if running else at,
                )
            )
        elif kind == "maintenance_record":
            still_open = rng.random() < 0.05
            rows[kind].append(
                MaintenanceRecord(
                    **common,
                    summary=rng.choice(["Leaking tap", "Boiler service", "Broken window", "Pest control"]),
                    opened_at=at - timedelta(days=rng.randint(0, 30)),
                    closed_at=None if still_open else at,
                )
            )
        else:
            rows[kind].append(
                TenantActivity(
                    **common,
                    activity_type=rng.choice(["portal_login", "payment", "message", "viewing"]),
                    details="demo",
                    occurred_at=at,
                )
            )
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
