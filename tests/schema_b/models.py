from __future__ import annotations

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
