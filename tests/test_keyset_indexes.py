from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from properties.models import Lease, MaintenanceRecord, Portfolio, Property, TenantActivity
from retention.eligibility import db_datetime
from retention.registry import REGISTRY

pytestmark = pytest.mark.django_db

PREFIX = {"lease": "lease", "maintenance_record": "maintenance", "tenant_activity": "activity"}


def explain(sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.parametrize("kind", list(REGISTRY))
def test_batch_scans_and_due_probes_use_the_record_indexes(kind):
    portfolio = Portfolio.objects.create(name="P", slug="p")
    props = [Property.objects.create(portfolio=portfolio, name=f"B{i}") for i in range(10)]
    # A month's start, whatever today is: the first table partition of tenant
    # activity holding rows is then full (a partial one of a few hundred rows
    # is rightly read by a seq scan, as it was when now - 900 days fell mid-June).
    base = datetime(2023, 6, 1, tzinfo=UTC)
    rows = []
    for i in range(20000):
        p = props[i % 10]
        at = base + timedelta(hours=i)
        common = {"portfolio": portfolio, "property": p}
        if kind == "lease":
            rows.append(Lease(**common, unit="1", tenant_name="T", started_on=at.date(), ended_at=at))
        elif kind == "maintenance_record":
            rows.append(MaintenanceRecord(**common, summary="s", opened_at=at, closed_at=at))
        else:
            rows.append(TenantActivity(**common, activity_type="a", occurred_at=at))
    REGISTRY[kind].model.objects.bulk_create(rows, batch_size=5000)
    spec = REGISTRY[kind]
    ts = spec.timestamp_column
    cutoff = db_datetime(base + timedelta(days=400))
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {spec.table}")

        cursor.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = %s::regclass", [spec.table])
        partitioned = cursor.fetchone()[0]
        cursor.execute(f"SELECT DISTINCT tableoid::regclass::text FROM {spec.table}")
        holding_rows = [name for (name,) in cursor.fetchall()]

    # A batch: the next ids of one property after the cursor, in id order.
    batch = explain(
        f"SELECT r.id FROM {spec.table} r WHERE r.property_id = %s AND r.id > %s AND r.{ts} < %s"
        " ORDER BY r.property_id, r.id LIMIT 200",
        [props[3].pk, 0, cutoff],
    )
    due = explain(
        f"SELECT COUNT(*) FROM {spec.table} r WHERE r.property_id = %s AND r.{ts} < %s", [props[3].pk, cutoff]
    )
    if partitioned:
        # Tenant activity, monthly partitioned (properties 0006): each table partition
        # has its copy of the indexes, under its own name; an empty one may be read by
        # a seq scan of nothing, one holding rows never is. (Whether the planner merges
        # the table partitions' keyset scans or sorts a few thousand rows is its choice.)
        for name in holding_rows:
            assert f"Seq Scan on {name} " not in batch and f"Seq Scan on {name} " not in due, (batch, due)
        return
    assert f"{PREFIX[kind]}_keyset_idx" in batch, batch
    assert "Seq Scan" not in batch and "Sort" not in batch, batch

    # Admission and previews: does (and how much of) a property lie past the cutoff.
    assert f"{PREFIX[kind]}_due_idx" in due, due
    assert "Seq Scan" not in due, due
