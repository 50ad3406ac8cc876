"""Proof of disposition: what a sweep deleted, as identifiers, counts and digests.

Per job: portfolio, property, record kind, policy version, cutoff, rows
deleted, the batch size it ran with (its policy version's; each ledger row
keeps its own ``batch_limit``, which is part of its operation id), and
``digest`` = sha256 over the job's operation ids, sorted and joined by
newlines. Per sweep: ``digest`` = sha256 over the job digests in job
id order, joined by newlines. Nothing in the export is a record's content.

The export also carries every operation id's *inputs* (``operation_inputs``
per job: the keyset slice's ``after_id``, its ``limit`` and the ``cutoff``
it ran with, beside the sweep's ``slot`` and the job's record kind and
property), so an auditor without database access recomputes every operation
id, every job digest and the sweep digest from the export alone
(``cleanup_ops.proof_verify``; ``manage.py cleanup_proof_verify FILE``). The
CSV carries them as ``# operation`` lines after the table, one per operation.

The deleted records' attachments are summed under ``attachments``: purged,
already gone, set aside under a legal hold placed after the batch (and how
many still wait for its release), skipped because a remaining record still
names them, invalid ids. Counts only, never a document id.

Whole table partitions dropped before the sweep's admission
(``cleanup_ops.table_partitions``) are listed under ``table_partitions``, one
entry per ``TablePartitionDrop``: kind, table, table partition, bounds, rows,
``ids_digest`` (its formula in ``cleanup_ops.models.table_partitions``), the
drop's ``operation_id`` (``TABLE_PARTITION_ID_METHOD``, recomputed by the
verifier) and per portfolio its rows, policy version and cutoff (never before
the upper bound: the verifier checks that too). Their rows are counted in
``table_partition_rows``, apart from the jobs' ``rows_deleted``; the sweep
digest stays the jobs'. The CSV carries them as ``# table_partition`` and
``# table_partition_portfolio`` lines.

Each operation also carries its ledger row as the ledger's hash chain
hashed it (``ledger``: id, ``prev_id``, ``prev_hash``, ``hash``, policy
version, candidates, rows deleted and held, applied at; the chain's protocol
is ``cleanup_ops.ledger_chain``), and ``ledger_heads`` names the chain heads
the proof covers: per portfolio its last ledger row of the sweep (id and
hash), and the last table-partition drop's. The heads are under the
signature; the verifier recomputes the rows and checks they chain to them
(the drops' rows are not carried: their head is named, signed). The CSV carries
the heads as ``# ledger_head <chain> <id> <hash>`` lines, not the rows.

Every export is signed (``proof_sign``, ``proof_csv_sign``): one Ed25519
signature over the whole document, made with the platform's key
(``cleanup_ops.proof_keys``), so no field (a count, a state, a cutoff, an
attachment figure, the scope) can be edited unseen and a proof written by
hand does not verify. What exactly is signed, and how the verifier checks it
with the published public key alone, is ``cleanup_ops.proof_verify``'s
docstring; the canonical form is imported from there so the two cannot drift.

For a customer's staff (``portfolio_ids``) the proof covers their portfolios'
jobs only: the sweep digest is then over their job digests, which they can
recompute from their own rows, and ``portfolio_ids`` says what it covers. A
table partition they shared with other customers shows their portfolios
only, its rows as theirs, and no ids digest (it covers others' ids).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
from datetime import UTC, datetime
from typing import Any

from cleanup_ops.ledger_chain import DROPS_CHAIN, portfolio_chain
from cleanup_ops.models import CleanupJob, LedgerEntry, Sweep, TablePartitionDrop
from cleanup_ops.proof_keys import proof_signing_key
from cleanup_ops.proof_verify import (
    CSV_SIGNATURE,
    LEDGER_CHAIN_METHOD,
    SIGNATURE_ALGORITHM,
    SIGNED_METHOD,
    csv_signed_bytes,
    json_signed_bytes,
)
from cleanup_ops.selectors import sweep_attachments, sweep_figures_seen, sweeps_seen
from retention.domain import key_json

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
    "batch_size",
    "operations",
    "digest",
]


def sweep_proof(*, sweep: Sweep, portfolio_ids: frozenset[int] | None = None) -> dict[str, Any]:
    """A few queries whatever the sweep's size; operation ids are streamed.
    ``portfolio_ids``: only those portfolios' jobs (``None``: all)."""
    in_scope = {} if portfolio_ids is None else {"portfolio_id__in": sorted(portfolio_ids)}
    jobs = list(
        CleanupJob.objects.filter(sweep=sweep, **in_scope)
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
            "batch_size",
        )
    )
    hashers: dict[int, Any] = {}
    counts: dict[int, int] = {}
    inputs: dict[int, list[dict[str, Any]]] = {}
    ledger = (
        LedgerEntry.objects.filter(job__sweep=sweep, **in_scope)
        .order_by("job_id", "operation_id")
        .values_list(
            "job_id",
            "operation_id",
            "after_id",
            "last_id",
            "batch_limit",
            "cutoff",
            "after_key",
            "last_key",
            *LEDGER_ROW_FIELDS,
        )
        .iterator(chunk_size=5000)
    )
    heads: dict[int, tuple[int, str | None]] = {}  # per portfolio: its chain's last row of this sweep
    for job_id, operation_id, after_int, last_int, limit, cutoff, after_key, last_key, *chained in ledger:
        row = dict(zip(LEDGER_ROW_FIELDS, chained, strict=True))
        portfolio = row.pop("portfolio_id")
        row["hash"] = row.pop("entry_hash")
        if portfolio not in heads or heads[portfolio][0] < row["id"]:
            heads[portfolio] = (row["id"], row["hash"])
        row["applied_at"] = rfc3339(row["applied_at"])
        # A non-integer key: the range as text, "" before the first batch (what the id hashes).
        after_id: int | str = after_key if last_key else after_int
        last_id: int | str = last_key if last_key else last_int
        hasher = hashers.get(job_id)
        if hasher is None:
            hasher = hashers[job_id] = hashlib.sha256()
        else:
            hasher.update(b"\n")
        hasher.update(operation_id.encode())
        counts[job_id] = counts.get(job_id, 0) + 1
        inputs.setdefault(job_id, []).append(
            {
                "operation_id": operation_id,
                "after_id": after_id,
                "last_id": last_id,
                "limit": limit,
                "cutoff": rfc3339(cutoff),
                # The row as its chain hashed it (cleanup_ops.ledger_chain).
                "ledger": row,
            }
        )
    rows: list[dict[str, Any]] = []
    for job in jobs:
        digest = (hashers.get(job["id"]) or hashlib.sha256()).hexdigest()
        rows.append(
            {
                "job_id": job["id"],
                "job_key": job["key"],
                # A key as JSON carries it: a number, or a UUID's (a string key's) text.
                "portfolio_id": key_json(job["portfolio_id"]),
                "property_id": key_json(job["property_id"]),
                "record_kind": job["record_kind"],
                "policy_version_id": job["policy_version_id"],
                "cutoff": job["cutoff"].isoformat(),
                "state": job["state"],
                "outcome": job["outcome"],
                "rows_deleted": job["rows_deleted"],
                "batch_size": job["batch_size"],
                "operations": counts.get(job["id"], 0),
                "digest": digest,
                "operation_inputs": inputs.get(job["id"], []),
            }
        )
    sweep_digest = hashlib.sha256("\n".join(r["digest"] for r in rows).encode()).hexdigest()
    dropped, drops_head = table_partition_drops_and_head(sweep=sweep, portfolio_ids=portfolio_ids)
    # The status the console's sweep page and the API's sweep give the same
    # reader (selectors.sweep_figures_seen): counted from the proof's own jobs,
    # a dead job later redriven would call a recovered sweep "with dead letters".
    seen = sweep_figures_seen(sweeps_seen(portfolio_ids=portfolio_ids).get(pk=sweep.pk))
    status = seen.get("status", sweep.status)
    scope: dict[str, Any] = (
        {} if portfolio_ids is None else {"portfolio_ids": [key_json(p) for p in sorted(portfolio_ids)]}
    )
    return {
        "sweep_id": sweep.pk,
        "key": sweep.key,
        "status": status,
        **scope,
        "jobs": len(rows),
        "rows_deleted": sum(r["rows_deleted"] for r in rows),
        "digest": sweep_digest,
        "digest_method": "sha256 of job digests (job id order, newline-joined); "
        "job digest = sha256 of its sorted operation ids, newline-joined",
        "slot": rfc3339(sweep.slot),
        "operation_id_method": OPERATION_ID_METHOD,
        # The deleted records' attachments: a purge job that set files aside
        # under a legal hold has the outcome purge_held.
        "attachments": sweep_attachments(sweep_id=sweep.pk, portfolio_ids=portfolio_ids),
        "partitions": rows,
        # The chain heads this proof covers (under the signature): per portfolio
        # its last ledger row of the sweep, and the last table-partition drop's.
        "ledger_chain_method": LEDGER_CHAIN_METHOD,
        "ledger_heads": ledger_heads(heads, drops_head),
        "table_partition_rows": sum(d["rows"] for d in dropped),
        "table_partition_id_method": TABLE_PARTITION_ID_METHOD,
        "table_partitions": dropped,
    }


# What each operation's ``ledger`` block carries: the ledger row's chain
# fields and the counts its hash covers beyond the operation's inputs
# (``entry_hash`` as ``hash``; the portfolio is the job's, taken out).
LEDGER_ROW_FIELDS = (
    "portfolio_id",
    "id",
    "prev_id",
    "prev_hash",
    "entry_hash",
    "policy_version_id",
    "candidates",
    "rows_deleted",
    "rows_held",
    "applied_at",
)


def ledger_heads(
    heads: dict[int, tuple[int, str | None]], drops_head: tuple[int, str | None] | None
) -> list[dict[str, Any]]:
    """The chain heads a proof names: per portfolio (in id order) its last ledger row
    of the sweep, then the last table-partition drop's, when the proof lists drops."""
    out: list[dict[str, Any]] = [
        {"chain": portfolio_chain(portfolio), "entry_id": entry_id, "entry_hash": entry_hash}
        for portfolio, (entry_id, entry_hash) in sorted(heads.items())
    ]
    if drops_head is not None:
        out.append({"chain": DROPS_CHAIN, "entry_id": drops_head[0], "entry_hash": drops_head[1]})
    return out


TABLE_PARTITION_ID_METHOD = (
    "sha256 of table_partition:<record_kind>:<table>:<table_partition>:<lower_bound>:<upper_bound>:<slot> "
    "(times in RFC 3339 UTC with Z; lower_bound '-' when unbounded; "
    "the same as cleanup_ops.table_partitions.drop_operation_id)"
)


def table_partition_drops(*, sweep: Sweep, portfolio_ids: frozenset[int] | None) -> list[dict[str, Any]]:
    """The sweep's whole table partitions dropped, in drop order (only those
    with one of ``portfolio_ids``, shown for them alone, when given)."""
    return table_partition_drops_and_head(sweep=sweep, portfolio_ids=portfolio_ids)[0]


def table_partition_drops_and_head(
    *, sweep: Sweep, portfolio_ids: frozenset[int] | None
) -> tuple[list[dict[str, Any]], tuple[int, str | None] | None]:
    """``table_partition_drops``, and the last listed drop's row in the drops'
    chain (id, ``entry_hash``; None when none is listed): the head the proof names."""
    out = []
    head: tuple[int, str | None] | None = None
    for drop in TablePartitionDrop.objects.filter(sweep=sweep).order_by("id"):
        portfolios = {
            key: value
            for key, value in drop.portfolios.items()
            if portfolio_ids is None or key in {str(p) for p in portfolio_ids}
        }
        if portfolio_ids is not None and not portfolios:
            continue
        out.append(
            {
                "record_kind": drop.record_kind,
                "table": drop.table,
                "table_partition": drop.table_partition,
                "lower_bound": rfc3339(drop.lower_bound) if drop.lower_bound else None,
                "upper_bound": rfc3339(drop.upper_bound),
                "rows": drop.rows if portfolio_ids is None else sum(v["rows"] for v in portfolios.values()),
                "ids_digest": drop.ids_digest if portfolio_ids is None else None,
                "operation_id": drop.operation_id,
                "portfolios": portfolios,
            }
        )
        head = (drop.pk, drop.entry_hash)
    return out, head


OPERATION_ID_METHOD = (
    "sha256 of retention:<record_kind>:<property_id>:<slot>:<cutoff>:<after_id>:<limit> "
    "(slot and cutoff in RFC 3339 UTC with Z; property_id is portfolio-<portfolio_id> for a kind without a "
    "property; after_id is a non-integer key's text, empty before the first batch, '-' in the CSV; "
    "the same as cleanup_ops.execution.batches.operation_id)"
)


def rfc3339(value: datetime) -> str:
    """The form an operation id hashes a time in: UTC, ``Z``, microseconds only if any."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def proof_csv(proof: dict[str, Any]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(proof["partitions"])
    out.write(f"# sweep {proof['key']} digest {proof['digest']} rows_deleted {proof['rows_deleted']}\n")
    attachments = " ".join(f"{name} {n}" for name, n in proof["attachments"].items())
    out.write(f"# attachments {attachments}\n")
    # The operation ids' inputs (``proof_verify`` reads them back).
    out.write(f"# slot {proof['slot']}\n")
    # The chain heads the proof covers (``proof_verify`` reads them back).
    for head in proof.get("ledger_heads", []):
        out.write(f"# ledger_head {head['chain']} {head['entry_id']} {head['entry_hash']}\n")
    out.write("# operations: job_id after_id last_id limit cutoff operation_id\n")
    # Whole table partitions dropped (``proof_verify`` reads them back).
    for d in proof.get("table_partitions", []):
        out.write(
            f"# table_partition {d['record_kind']} {d['table']} {d['table_partition']} {d['lower_bound'] or '-'} "
            f"{d['upper_bound']} {d['rows']} {d['ids_digest'] or '-'} {d['operation_id']}\n"
        )
        for portfolio_id, p in d["portfolios"].items():
            out.write(
                f"# table_partition_portfolio {d['table_partition']} {portfolio_id} {p['rows']} "
                f"{p['policy_version_id']} {p['cutoff']}\n"
            )
    for partition in proof["partitions"]:
        for op in partition["operation_inputs"]:
            # An empty text cursor (a non-integer key's first batch) is "-": the line is split on spaces.
            after = "-" if op["after_id"] == "" else op["after_id"]
            out.write(
                f"# operation {partition['job_id']} {after} {op['last_id']} {op['limit']} "
                f"{op['cutoff']} {op['operation_id']}\n"
            )
    return out.getvalue()


def proof_sign(*, proof: dict[str, Any]) -> dict[str, Any]:
    """The proof as served, signed: JSON values only (what any renderer writes and the
    verifier reads back), with a ``signature`` block naming the key id.
    ``ProofKeyMissing`` with DEBUG off and no key."""
    key = proof_signing_key()
    # A round trip through JSON: the signature covers the values the file will hold,
    # and a non-JSON value (a datetime left unformatted) fails here, not at the auditor's.
    document: dict[str, Any] = json.loads(json.dumps(proof, allow_nan=False))
    document.pop("signature", None)
    document["signature"] = {"algorithm": SIGNATURE_ALGORITHM, "key_id": key.key_id, "signed": SIGNED_METHOD}
    value = key.private.sign(json_signed_bytes(document))
    document["signature"]["value"] = base64.b64encode(value).decode()
    return document


def proof_csv_sign(*, proof: dict[str, Any]) -> str:
    """The CSV export with its last line ``# signature Ed25519 <key_id> <base64>``, over every line before it."""
    key = proof_signing_key()
    text = proof_csv(proof)
    value = key.private.sign(csv_signed_bytes(text))
    return f"{text}{CSV_SIGNATURE}{SIGNATURE_ALGORITHM} {key.key_id} {base64.b64encode(value).decode()}\n"
