from __future__ import annotations

import uuid

from django.db import models

from properties.models import Portfolio, Property


class WorkOrder(models.Model):
    """Closed on a day (a DateField), a contract kept in the document store."""

    number = models.BigAutoField(primary_key=True)
    customer = models.ForeignKey(Portfolio, on_delete=models.PROTECT, related_name="+")
    building = models.ForeignKey(Property, on_delete=models.PROTECT, related_name="+", db_index=False)
    closed_on = models.DateField()
    # NULL when no contract: a host schema's convention, not the demo's "".
    contract_ref = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001

    class Meta:
        app_label = "schema_b"
        indexes = [models.Index(fields=["building", "number"], include=["closed_on"], name="workorder_keyset_idx")]

    def __str__(self) -> str:
        return f"work order {self.number}"


class Inspection(models.Model):
    """No keyset index: what the system check asks to add."""

    customer = models.ForeignKey(Portfolio, on_delete=models.PROTECT, related_name="+")
    building = models.ForeignKey(Property, on_delete=models.PROTECT, related_name="+")
    done_at = models.DateTimeField()
    notes = models.TextField(default="")

    class Meta:
        app_label = "schema_b"

    def __str__(self) -> str:
        return f"inspection {self.pk}"


# --- Issue 27: attachments in Django storages ---------------------------------
# (Kept apart from the other schema_b models: its own migration, 0002_signed_contract.)


class SignedContract(models.Model):
    """Its signed PDF in a Django storage (a ``FileField``: S3 or the file system)."""

    customer = models.ForeignKey(Portfolio, on_delete=models.PROTECT, related_name="+")
    building = models.ForeignKey(Property, on_delete=models.PROTECT, related_name="+", db_index=False)
    signed_at = models.DateTimeField()
    # Up to S3's key length in characters (a key is at most 1,024 bytes).
    pdf = models.FileField(max_length=1024, blank=True, default="")

    class Meta:
        app_label = "schema_b"
        indexes = [models.Index(fields=["building", "id"], include=["signed_at"], name="signedcontract_keyset_idx")]

    def __str__(self) -> str:
        return f"signed contract {self.pk}"


# --- Record shapes (tests/record_shapes.py) -------------------------------------
# Kinds of other shapes than the demo's: a UUID key, a property reached
# through a unit, no property, an unmanaged table made in SQL, a monthly-
# partitioned table. Kept apart from the models above (and in migrations of
# their own, 0003 on): other work adds models to this app too.


class Ticket(models.Model):
    """Keyed by a UUID; a document in the store."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    customer = models.ForeignKey(Portfolio, on_delete=models.PROTECT, related_name="+")
    building = models.ForeignKey(Property, on_delete=models.PROTECT, related_name="+", db_index=False)
    resolved_at = models.DateTimeField()
    document_id = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        app_label = "schema_b"
        indexes = [models.Index(fields=["building", "id"], include=["resolved_at"], name="ticket_keyset_idx")]

    def __str__(self) -> str:
        return f"ticket {self.pk}"


class Notice(models.Model):
    """No property: a customer-wide record (its partition is the portfolio)."""

    customer = models.ForeignKey(Portfolio, on_delete=models.PROTECT, related_name="+", db_index=False)
    sent_at = models.DateTimeField()
    document_id = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        app_label = "schema_b"
        indexes = [models.Index(fields=["customer", "id"], include=["sent_at"], name="notice_keyset_idx")]

    def __str__(self) -> str:
        return f"notice {self.pk}"


class Unit(models.Model):
    """A unit of a building; a unit not (or no longer) in a building has none."""

    building = models.ForeignKey(Property, on_delete=models.PROTECT, related_name="+", null=True, blank=True)
    name = models.CharField(max_length=40, default="")

    class Meta:
        app_label = "schema_b"

    def __str__(self) -> str:
        return f"unit {self.pk}"


class Visit(models.Model):
    """Its property is its unit's (``"property": "unit__building"``): no copied column."""

    customer = models.ForeignKey(Portfolio, on_delete=models.PROTECT, related_name="+")
    unit = models.ForeignKey(Unit, on_delete=models.PROTECT, related_name="+", null=True, blank=True, db_index=False)
    visited_at = models.DateTimeField()

    class Meta:
        app_label = "schema_b"
        indexes = [models.Index(fields=["unit", "id"], include=["visited_at"], name="visit_keyset_idx")]

    def __str__(self) -> str:
        return f"visit {self.pk}"


class LegacyCharge(models.Model):
    """A table another application owns (``managed = False``): made in SQL by
    migration 0006, with its keyset index, not by Django — the way for a
    non-Django application's rows. Its columns keep their own names."""

    id = models.BigAutoField(primary_key=True, db_column="charge_no")
    customer = models.ForeignKey(Portfolio, on_delete=models.DO_NOTHING, related_name="+", db_column="account_ref")
    building = models.ForeignKey(Property, on_delete=models.DO_NOTHING, related_name="+", db_column="site_ref")
    billed_at = models.DateTimeField(db_column="billed")

    class Meta:
        app_label = "schema_b"
        managed = False
        db_table = "legacy_charges"

    def __str__(self) -> str:
        return f"charge {self.pk}"


class MeterReading(models.Model):
    """A monthly-partitioned table on PostgreSQL (``PARTITION BY RANGE`` on
    the retention timestamp), made in SQL by migration 0007: the keyset
    index is a partitioned index (on every partition). Cleaned by row
    deletes through the normal statements (the cutoff prunes the partitions
    after it)."""

    customer = models.ForeignKey(Portfolio, on_delete=models.DO_NOTHING, related_name="+")
    building = models.ForeignKey(Property, on_delete=models.DO_NOTHING, related_name="+")
    read_at = models.DateTimeField()

    class Meta:
        app_label = "schema_b"
        managed = False
        db_table = "meter_readings"

    def __str__(self) -> str:
        return f"reading {self.pk}"


class UnitReading(models.Model):
    """A monthly-partitioned table (migration 0008) whose property is its
    unit's (``"property": "unit__building"``): whole table partitions of a
    one-hop kind, dropped."""

    customer = models.ForeignKey(Portfolio, on_delete=models.DO_NOTHING, related_name="+")
    unit = models.ForeignKey(Unit, on_delete=models.DO_NOTHING, related_name="+", null=True)
    read_at = models.DateTimeField()

    class Meta:
        app_label = "schema_b"
        managed = False
        db_table = "unit_readings"

    def __str__(self) -> str:
        return f"unit reading {self.pk}"
