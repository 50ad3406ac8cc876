"""One unsaved record of any of the demo schema's kinds: the demo seeder's and the tests'.

``record_build`` is the one place that knows which fields each kind's row needs, so
that a new kind (or a new required field) is added once and an unknown kind is an
error rather than a row of another kind. With an ``rng`` the values are realistic
(the demo, ``demo.services.demo_data_seed``): a share of leases still running and of
work orders still open, units, tenants and summaries drawn from it. The draws are
made in a fixed order per kind, so a seed gives the same rows every time. Without
one the values are fixed and every record carries ``at`` (the tests).
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from properties.models import Lease, MaintenanceRecord, TenantActivity


def record_build(
    kind: str, *, portfolio_id: int, property_id: int, at: datetime, rng: random.Random | None = None
) -> Lease | MaintenanceRecord | TenantActivity:
    """An unsaved ``kind`` row in ``property_id`` whose retention timestamp is ``at``
    (unless ``rng`` leaves it running or open); ``ValueError`` for any other kind."""
    common = {"portfolio_id": portfolio_id, "property_id": property_id}
    if kind == "lease":
        if rng is None:
            return Lease(**common, unit="1", tenant_name="T", started_on=at.date(), ended_at=at)
        running = rng.random() < 0.1
        return Lease(
            **common,
            unit=f"{rng.randint(1, 40)}{rng.choice('ABCD')}",
            tenant_name=f"Tenant {rng.randint(1000, 9999)}",
            started_on=(at - timedelta(days=365)).date(),
            ended_at=None if running else at,
        )
    if kind == "maintenance_record":
        if rng is None:
            return MaintenanceRecord(**common, summary="s", opened_at=at, closed_at=at)
        still_open = rng.random() < 0.05
        return MaintenanceRecord(
            **common,
            summary=rng.choice(["Leaking tap", "Boiler service", "Broken window", "Pest control"]),
            opened_at=at - timedelta(days=rng.randint(0, 30)),
            closed_at=None if still_open else at,
        )
    if kind == "tenant_activity":
        if rng is None:
            return TenantActivity(**common, activity_type="login", occurred_at=at)
        return TenantActivity(
            **common,
            activity_type=rng.choice(["portal_login", "payment", "message", "viewing"]),
            details="demo",
            occurred_at=at,
        )
    raise ValueError(f"no record builder for the record kind {kind!r} (lease, maintenance_record, tenant_activity)")
