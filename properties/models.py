"""The property-records domain whose rows expire.

Every record row carries both its property and its portfolio so that the
eligibility predicate can match legal holds without a join (and tenant scoping
can filter without one); a composite foreign key guarantees that
the copy equals the property's portfolio (migration 0003). Each record
table has two indexes (``record_indexes``): ``(property, retention timestamp,
id)`` for admission's "rows past the cutoff?", and ``(property, id)``
including the timestamp for the keyset scan a cleanup job runs per property.
"""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models

# An attachment is a file in the document store (see cleanup_ops.downstream.purge); the
# record keeps only the store's document id. Ids are strict so a record can
# never smuggle a URL or a path into a request to the store.
document_id_validator = RegexValidator(r"^[A-Za-z0-9_-]{1,64}\Z", "A document id is 1-64 letters, digits, '-' or '_'.")


def document_id_field() -> models.CharField:
    return models.CharField(
        max_length=64,
        null=True,
        blank=True,
        validators=[document_id_validator],
        help_text="Attachment in the document store (signed lease, photos); purged after the record is deleted.",
    )


def document_index(prefix: str) -> models.Index:
    """``<prefix>_document_idx``: "does any remaining record still name this
    document?", asked before each attachment is purged (partial: most rows
    have no attachment)."""
    return models.Index(
        fields=["document_id"], condition=models.Q(document_id__isnull=False), name=f"{prefix}_document_idx"
    )


def record_indexes(prefix: str, timestamp: str) -> list[models.Index]:
    """The two indexes every record table has (the FK's own index is redundant).

    ``<prefix>_due_idx`` (property, timestamp, id): "does this property have
    rows past the cutoff, and how many" for admission and previews.
    ``<prefix>_keyset_idx`` (property, id) including the timestamp: a batch
    walks one property in id order from its cursor and stops after ``limit``
    matches, so each batch reads only rows it has not passed yet; the included
    timestamp lets PostgreSQL test the cutoff from the index alone.
    """
    return [
        models.Index(fields=["property", timestamp, "id"], name=f"{prefix}_due_idx"),
        models.Index(fields=["property", "id"], include=[timestamp], name=f"{prefix}_keyset_idx"),
    ]


class Portfolio(models.Model):
    """A customer account of the SaaS: the unit of fairness and policy scope."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        # A host names its own customer model instead (like AUTH_USER_MODEL).
        swappable = "RETENTION_PORTFOLIO_MODEL"

    def __str__(self) -> str:
        return self.name


class Property(models.Model):
    portfolio = models.ForeignKey(Portfolio, on_delete=models.PROTECT, related_name="properties")
    name = models.CharField(max_length=200)

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "properties"
        # A host names its own site model instead (like AUTH_USER_MODEL).
        swappable = "RETENTION_PROPERTY_MODEL"
        constraints = [
            # Redundant as a uniqueness rule (id is the key); it exists as the
            # target of each record table's composite foreign key
            # (property_id, portfolio_id), which makes the copied portfolio_id
            # provably the property's own (migration 0003, PostgreSQL).
            models.UniqueConstraint(fields=["id", "portfolio"], name="property_id_portfolio_unique"),
        ]

    def __str__(self) -> str:
        return self.name


class Lease(models.Model):
    portfolio = models.ForeignKey(Portfolio, on_delete=models.PROTECT, related_name="+")
    property = models.ForeignKey(Property, on_delete=models.PROTECT, related_name="leases", db_index=False)
    unit = models.CharField(max_length=50)
    tenant_name = models.CharField(max_length=200)
    started_on = models.DateField()
    # Retention timestamp; null while the lease is still running.
    ended_at = models.DateTimeField(null=True, blank=True)
    document_id = document_id_field()

    class Meta:
        indexes = [*record_indexes("lease", "ended_at"), document_index("lease")]

    def __str__(self) -> str:
        return f"Lease {self.pk} ({self.unit})"


class MaintenanceRecord(models.Model):
    portfolio = models.ForeignKey(Portfolio, on_delete=models.PROTECT, related_name="+")
    property = models.ForeignKey(Property, on_delete=models.PROTECT, related_name="maintenance_records", db_index=False)
    summary = models.CharField(max_length=300)
    opened_at = models.DateTimeField()
    # Retention timestamp; null while the work order is open.
    closed_at = models.DateTimeField(null=True, blank=True)
    document_id = document_id_field()

    class Meta:
        indexes = [*record_indexes("maintenance", "closed_at"), document_index("maintenance")]

    def __str__(self) -> str:
        return f"Maintenance record {self.pk}"


class TenantActivity(models.Model):
    portfolio = models.ForeignKey(Portfolio, on_delete=models.PROTECT, related_name="+")
    property = models.ForeignKey(Property, on_delete=models.PROTECT, related_name="tenant_activities", db_index=False)
    activity_type = models.CharField(max_length=50)
    details = models.CharField(max_length=300, blank=True, default="")
    occurred_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "tenant activities"
        indexes = [*record_indexes("activity", "occurred_at")]

    def __str__(self) -> str:
        return f"Tenant activity {self.pk}"
