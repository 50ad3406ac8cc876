"""A host keyed by UUIDs: its user, customers and sites (tests/schema_uuid/__init__.py).

The records keep the demo's bigint keys and field names (``properties.models``):
what differs from the demo is only the key type of the user, the customer and
the site, so a failure on this schema is a failure of the product on UUID scope
keys. The site's foreign key to its customer is named ``portfolio``, as the
demo's, for the same reason (another name is ``RETENTION_PROPERTY_PORTFOLIO_FIELD``'s,
proven by tests/test_host_uuid_keys.py).
"""

from __future__ import annotations

import uuid

from django.contrib.auth.models import AbstractUser
from django.db import models


class User(AbstractUser):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)

    class Meta:
        app_label = "schema_uuid"


class Customer(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)

    class Meta:
        app_label = "schema_uuid"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Site(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    portfolio = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="sites")
    name = models.CharField(max_length=200)

    class Meta:
        app_label = "schema_uuid"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


def keyset_index(prefix: str, timestamp: str) -> models.Index:
    """(site, id) including the timestamp: the index a cleanup batch walks (retention.registry)."""
    return models.Index(fields=["property", "id"], include=[timestamp], name=f"uuid_{prefix}_keyset_idx")


def document_index(prefix: str) -> models.Index:
    """ "Does a remaining record still name this document?", asked before each purge."""
    return models.Index(
        fields=["document_id"], condition=models.Q(document_id__isnull=False), name=f"uuid_{prefix}_document_idx"
    )


class Lease(models.Model):
    portfolio = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="+")
    property = models.ForeignKey(Site, on_delete=models.PROTECT, related_name="leases", db_index=False)
    unit = models.CharField(max_length=50)
    tenant_name = models.CharField(max_length=200)
    started_on = models.DateField()
    ended_at = models.DateTimeField(null=True, blank=True)
    document_id = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001 - the demo's "no document"

    class Meta:
        app_label = "schema_uuid"
        indexes = [keyset_index("lease", "ended_at"), document_index("lease")]

    def __str__(self) -> str:
        return f"Lease {self.pk} ({self.unit})"


class MaintenanceRecord(models.Model):
    portfolio = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="+")
    property = models.ForeignKey(Site, on_delete=models.PROTECT, related_name="maintenance_records", db_index=False)
    summary = models.CharField(max_length=300)
    opened_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    document_id = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001 - the demo's "no document"

    class Meta:
        app_label = "schema_uuid"
        indexes = [keyset_index("maintenance", "closed_at"), document_index("maintenance")]

    def __str__(self) -> str:
        return f"Maintenance record {self.pk}"
