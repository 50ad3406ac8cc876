"""The database keeps a record's portfolio its property's (PostgreSQL): a
composite foreign key refuses a mismatched row, and its migration refuses
to start over existing mismatched rows, counting them.
"""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from properties.models import Lease, MaintenanceRecord, Property, TenantActivity

from . import tenant_world
from .tenant_world import OLD

pytestmark = pytest.mark.django_db

world = tenant_world.world  # the fixture: Alder and Birch (tests/tenant_world.py)


def test_postgres_rejects_a_record_whose_portfolio_is_not_its_propertys(world):
    alder, birch = world["alder"], world["birch"]
    for model, extra in (
        (Lease, {"unit": "9", "tenant_name": "T", "started_on": OLD.date()}),
        (MaintenanceRecord, {"summary": "s", "opened_at": OLD}),
        (TenantActivity, {"activity_type": "login", "occurred_at": OLD}),
    ):
        with pytest.raises(IntegrityError), transaction.atomic():
            model.objects.create(portfolio_id=birch.pid, property_id=alder.prop.pk, **extra)
    with pytest.raises(IntegrityError), transaction.atomic():
        Lease.objects.filter(pk=alder.ids["running_lease"][0]).update(portfolio_id=birch.pid)
    with pytest.raises(IntegrityError), transaction.atomic():
        Property.objects.filter(pk=alder.prop.pk).update(portfolio_id=birch.pid)  # it still has records
    Lease.objects.create(
        portfolio_id=alder.pid, property_id=alder.prop.pk, unit="9", tenant_name="T", started_on=OLD.date()
    )


def test_the_migration_refuses_existing_mismatched_rows_and_counts_them(world):
    import importlib

    migration = importlib.import_module("properties.migrations.0003_record_portfolio_matches_property")
    with connection.cursor() as cursor:
        # Django's own keys are deferred: settle them so the table may be altered.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(
            "ALTER TABLE properties_maintenancerecord"
            " DROP CONSTRAINT properties_maintenancerecord_property_portfolio_fk"
        )
        cursor.execute(
            "UPDATE properties_maintenancerecord SET portfolio_id = %s WHERE id IN (%s, %s)",
            [world["birch"].pid, *world["alder"].ids["maintenance"]],
        )

    class Editor:
        connection = connection

    with pytest.raises(RuntimeError, match=r"properties_maintenancerecord: 2 row\(s\)"):
        migration.check_existing_rows(None, Editor())
