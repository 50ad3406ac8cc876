"""The ledger of whole table partitions dropped (``cleanup_ops.table_partitions``).

Beside ``LedgerEntry`` (one row per applied batch of row deletes), one
``TablePartitionDrop`` per table partition dropped whole, written in the
transaction that detaches and drops it: the row and the drop commit together
or not at all. Identifiers, bounds, counts and a digest only, never a
record's content. Its own module so the pipeline's models stay one subject
each; ``cleanup_ops.models`` imports it (a module of the models package).

``ids_digest`` = ``encode(sha256(convert_to(coalesce(string_agg(CAST(id AS
text), ',' ORDER BY id), ''), 'UTF8')), 'hex')`` over the table partition's
rows when it was dropped: sha256 (hex) of its ids as the database spells
them, in id order, joined by ``,`` (the empty text for no row). An auditor
holding an export of the ids recomputes it.

``portfolios`` = ``{portfolio_id: {"rows": n, "policy_version_id": id,
"cutoff": RFC 3339}}``: per portfolio present, its rows and the approved,
enabled version whose cutoff (slot - retention days) the table partition's
upper bound did not pass.

``operation_id`` = sha256 of ``table_partition:<record_kind>:<table>:<table
partition>:<lower>:<upper>:<slot>`` (times RFC 3339 UTC, ``-`` for an
unbounded lower bound): a drop is recorded once.
"""

from __future__ import annotations

from django.db import models


class TablePartitionDrop(models.Model):
    """One table partition detached and dropped whole, in the transaction of the drop."""

    operation_id = models.CharField(max_length=64, unique=True)
    # The sweep whose trigger dropped it (NULL: the service was called on its own).
    sweep = models.ForeignKey(
        "cleanup_ops.Sweep", on_delete=models.PROTECT, null=True, blank=True, related_name="table_partition_drops"
    )
    record_kind = models.CharField(max_length=40)
    table = models.CharField(max_length=128, help_text="The partitioned table (the kind's).")
    table_partition = models.CharField(max_length=128)
    lower_bound = models.DateTimeField(null=True, blank=True, help_text="NULL: MINVALUE.")
    upper_bound = models.DateTimeField()
    rows = models.BigIntegerField()
    ids_digest = models.CharField(max_length=64)
    portfolios = models.JSONField(default=dict)
    slot = models.DateTimeField()
    dropped_at = models.DateTimeField()
    # The drops' hash chain (``cleanup_ops.ledger_chain``), written by the database.
    prev_id = models.BigIntegerField(null=True, blank=True)
    # NULL, not "": "not linked yet" differs from a first row's empty previous hash.
    prev_hash = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    entry_hash = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.table}.{self.table_partition}"


class LedgerChainHead(models.Model):
    """The last row of one ledger hash chain (``cleanup_ops.ledger_chain``).

    ``chain``: ``portfolio:<id>`` for a portfolio's ``LedgerEntry`` rows,
    ``table_partitions`` for the ``TablePartitionDrop`` rows. The row is what
    a writer locks ``FOR UPDATE`` before it links a new row to the chain, so
    two writers of one chain take turns and never fork it. Written by the
    database's trigger, never by Python."""

    chain = models.CharField(max_length=64, primary_key=True)
    entry_id = models.BigIntegerField(default=0, help_text="The last row's id; 0: no row yet.")
    entry_hash = models.CharField(max_length=64, default="", blank=True)
    entries = models.BigIntegerField(default=0, help_text="Rows linked so far.")

    class Meta:
        ordering = ["chain"]

    def __str__(self) -> str:
        return self.chain
