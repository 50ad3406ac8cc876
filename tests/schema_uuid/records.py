"""One unsaved record of this schema's kinds, for the tests (``properties.records`` is the demo's).

``tests.conftest.make_records`` calls the ``records.record_build`` of the app whose
model a kind names, so the same test makes rows of either schema.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tests.schema_uuid.models import Lease, MaintenanceRecord


def record_build(kind: str, *, portfolio_id: Any, property_id: Any, at: datetime) -> Lease | MaintenanceRecord:
    """An unsaved ``kind`` row in ``property_id`` whose retention timestamp is ``at``."""
    common = {"portfolio_id": portfolio_id, "property_id": property_id}
    if kind == "lease":
        return Lease(**common, unit="1", tenant_name="T", started_on=at.date(), ended_at=at)
    if kind == "maintenance_record":
        return MaintenanceRecord(**common, summary="s", opened_at=at, closed_at=at)
    raise ValueError(f"no record builder for the record kind {kind!r} (lease, maintenance_record)")
