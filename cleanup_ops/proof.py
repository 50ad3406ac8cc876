"""Proof of disposition: what a sweep deleted, as identifiers, counts and digests.

Per job: portfolio, property, record kind, policy version, cutoff, rows
deleted, and ``digest`` = sha256 over the job's operation ids, sorted and
joined by newlines. Per sweep: ``digest`` = sha256 over the job digests in job
id order, joined by newlines. Anyone holding the ledger can recompute both;
nothing in the export is a record's content.
"""

from __future__ import annotations

import csv
import hashlib
import io
from typing import Any

from cleanup_ops.models import CleanupJob, LedgerEntry, Sweep

# The export formats, checked before a format reaches a file name or a header.
PROOF_FORMATS = ("json", "csv")

CSV_FIELDS = [
    "job_id",
    "job_key",
    "portfolio_id",
    "property_id",
    "record_kind",
    "policy_version_id",
    "cutoff",
    "state",
    "outcome",
    "rows_deleted",
    "operations",
    "digest",
]


def sweep_proof(*, sweep: Sweep) -> dict[str, Any]:
    """Three queries whatever the sweep's size; operation ids are streamed."""
    jobs = list(
        CleanupJob.objects.filter(sweep=sweep)
        .order_by("id")
        .values(
            "id",
            "key",
            "portfolio_id",
            "property_id",
            "record_kind",
            "policy_version_id",
            "cutoff",
            "state",
            "outcome",
            "rows_deleted",
        )
    )
    hashers: dict[int, Any] = {}
    counts: dict[int, int] = {}
    ledger = (
        LedgerEntry.objects.filter(job__sweep=sweep)
        .order_by("job_id", "operation_id")
        .values_list("job_id", "operation_id")
        .iterator(chunk_size=5000)
    )
    for job_id, operation_id in ledger:
        hasher = hashers.get(job_id)
        if hasher is None:
            hasher = hashers[job_id] = hashlib.sha256()
        else:
            hasher.update(b"\n")
        hasher.update(operation_id.encode())
        counts[job_id] = counts.get(job_id, 0) + 1
    rows = []
    for job in jobs:
        digest = (hashers.get(job["id"]) or hashlib.sha256()).hexdigest()
        rows.append(
            {
                "job_id": job["id"],
                "job_key": job["key"],
                "portfolio_id": job["portfolio_id"],
                "property_id": job["property_id"],
                "record_kind": job["record_kind"],
                "policy_version_id": job["policy_version_id"],
                "cutoff": job["cutoff"].isoformat(),
                "state": job["state"],
                "outcome": job["outcome"],
                "rows_deleted": job["rows_deleted"],
                "operations": counts.get(job["id"], 0),
                "digest": digest,
            }
        )
    sweep_digest = hashlib.sha256("\n".join(r["digest"] for r in rows).encode()).hexdigest()
    return {
        "sweep_id": sweep.pk,
        "key": sweep.key,
        "status": sweep.status,
        "jobs": len(rows),
        "rows_deleted": sum(r["rows_deleted"] for r in rows),
        "digest": sweep_digest,
        "digest_method": "sha256 of job digests (job id order, newline-joined); "
        "job digest = sha256 of its sorted operation ids, newline-joined",
        "partitions": rows,
    }


def proof_csv(proof: dict[str, Any]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS)
    writer.writeheader()
    writer.writerows(proof["partitions"])
    out.write(f"# sweep {proof['key']} digest {proof['digest']} rows_deleted {proof['rows_deleted']}\n")
    return out.getvalue()
