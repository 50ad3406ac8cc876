"""Verify a proof of disposition from the export alone (JSON or CSV) and the platform's public key.

Two checks, both needed for a proof to verify:

1. **The signature.** Every field of the export is covered by one Ed25519
   signature made with the platform's key (``cleanup_ops.proof_keys``), so an
   edit to any figure (rows deleted, a portfolio, a policy version, a state,
   an outcome, a cursor, a cutoff, an attachment count) or a proof written by
   hand fails here. What is signed:

   - JSON: the UTF-8 bytes of ``canonical_json`` (``json.dumps`` with
     ``sort_keys=True``, ``separators=(",", ":")``, ``ensure_ascii=False``) of
     the whole document, its ``signature`` block included but without that
     block's ``value`` (so the algorithm, the key id and the method are signed
     too). Re-indenting the file or reordering its keys changes nothing.
   - CSV: every line before the last, ``# signature Ed25519 <key_id>
     <base64>``, joined by LF (a CRLF file reads the same), UTF-8.

   The signature names a key id; the verifier is given a set of public keys
   (``--public-key``: the key set JSON the platform publishes at
   ``/api/v1/proof-keys/`` and prints with ``manage.py cleanup_proof_key``, or
   a PEM public key, whose id is then its fingerprint ``ed25519-<16 hex>``).
   A key rotated out stays in the published set, so older proofs verify.

2. **The digests.** For every job, each operation id is recomputed from its
   inputs (record kind, property, the sweep's slot, cutoff, ``after_id``,
   ``limit``), the job digest from those operation ids, and the sweep digest
   from the job digests, and each is compared with what the export states;
   the sweep's totals are compared with the sum of its jobs'. A stated
   operation id is only a claim that the recomputation must match. These
   checks say *which* job differs; the signature says that the file is the
   platform's.

This module needs Python's standard library and ``cryptography`` (``pip
install cryptography``; no Django, no database), so it also runs on its own:
``python cleanup_ops/proof_verify.py FILE --public-key KEYS``. ``manage.py
cleanup_proof_verify FILE --public-key KEYS`` is the same check. The formulas
are written out here on purpose rather than imported from
``cleanup_ops.execution.batches``: the two are checked against each other by
the tests, and an auditor can read this one file whole. The signer
(``cleanup_ops.proof``) imports the canonical form from here, so the two
cannot drift.

Whole table partitions dropped (``table_partitions``): each drop's
operation id is recomputed from its inputs (record kind, table, table
partition, bounds, the slot), its rows must be the sum of its portfolios',
and no portfolio's cutoff may lie before its upper bound (a table partition is
dropped only when all of it is past every cutoff). ``ids_digest`` is stated
for an auditor who holds the ids (its formula:
``cleanup_ops.models.table_partitions``).

The ledger's hash chains (``ledger_heads``): the proof names, per
portfolio, the last ledger row of its jobs (id and ``entry_hash``) — its
chain's head as far as this sweep goes — and, for whole table partitions
dropped, the last drop's (named and signed; the drops' rows are not
carried). A JSON proof carries each operation's ledger row
(``ledger``: its id, ``prev_id``, ``prev_hash``, hash and counts); the
verifier recomputes every row's hash (``LEDGER_CHAIN_METHOD``), checks that a
row whose previous row is in the proof names that row's hash and that the last
row is the head named. A chain's rows of other sweeps are not in the proof:
the heads tie this proof to the database's chain, which ``manage.py
cleanup_ledger_verify`` walks whole.

Exit status: 0 when the signature is valid under a given key and every digest
is recomputed identical; 1 otherwise, with one line per problem naming the
field, digest or key that differs; 2 for a usage error.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import csv
import hashlib
import io
import json
import re
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

# --- The signature --------------------------------------------------------------------

SIGNATURE_ALGORITHM = "Ed25519"
SIGNED_METHOD = (
    "Ed25519 over the UTF-8 of json.dumps(the whole document, its signature block without 'value', "
    "sort_keys=True, separators=(',', ':'), ensure_ascii=False); "
    "CSV: over every line before '# signature', LF-joined"
)
CSV_SIGNATURE = "# signature "
# A key id is one word of the CSV's signature line: no spaces, nothing to escape.
KEY_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")

PublicKeys = dict[str, Ed25519PublicKey]


def _n(count: int, noun: str) -> str:
    """``_n(1, "row")`` → "1 row", ``_n(2, "row")`` → "2 rows": never a "(s)"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def canonical_json(document: Any) -> bytes:
    """The one serialisation that is signed (and re-made by the verifier)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


def json_signed_bytes(document: dict[str, Any]) -> bytes:
    """What a JSON proof's signature covers: the document, its signature block without ``value``."""
    block = document.get("signature")
    unsigned = dict(document)
    if isinstance(block, dict):
        unsigned["signature"] = {k: v for k, v in block.items() if k != "value"}
    return canonical_json(unsigned)


def csv_signed_bytes(text: str) -> bytes:
    """What a CSV proof's signature covers: every line before the signature's, each ended by LF."""
    normal = text.replace("\r\n", "\n")
    if not normal.endswith("\n"):
        raise ValueError("a CSV proof's lines each end with a newline")
    return normal.encode("utf-8")


def key_fingerprint(key: Ed25519PublicKey) -> str:
    """A public key's id when no other is given: ``ed25519-`` and 16 hex of the sha256 of its raw bytes."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519-" + hashlib.sha256(raw).hexdigest()[:16]


def public_keys_load(text: str) -> PublicKeys:
    """Public keys by key id, from the published key set (JSON) or one PEM public key."""
    stripped = text.strip()
    if stripped.startswith("-----BEGIN"):
        key = serialization.load_pem_public_key(stripped.encode())
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("the PEM public key is not an Ed25519 key")
        return {key_fingerprint(key): key}
    document = json.loads(stripped)
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError('expected a key set: {"keys": [{"key_id": ..., "public_key": <base64>}, ...]}')
    keys: PublicKeys = {}
    for entry in entries:
        if entry.get("algorithm", SIGNATURE_ALGORITHM) != SIGNATURE_ALGORITHM:
            raise ValueError(f"key {entry.get('key_id')!r}: algorithm {entry.get('algorithm')!r} is not Ed25519")
        raw = base64.b64decode(str(entry["public_key"]), validate=True)
        keys[str(entry["key_id"])] = Ed25519PublicKey.from_public_bytes(raw)
    return keys


def verify_signature(*, signed: bytes, key_id: Any, value: Any, keys: PublicKeys, report: Report) -> None:
    if not isinstance(key_id, str) or key_id not in keys:
        known = ", ".join(sorted(keys)) or "none"
        report.problems.append(f"signature: key id {key_id!r} is unknown (the public keys given: {known})")
        return
    try:
        raw = base64.b64decode(str(value), validate=True)
        # Only the one encoding of the bytes: an edit to any character of the file fails.
        if base64.b64encode(raw).decode() != value:
            raise ValueError("not canonical base64")
        keys[key_id].verify(raw, signed)
    except (InvalidSignature, binascii.Error, ValueError):
        report.problems.append(
            f"signature: invalid under key {key_id}: the file is not the one the platform signed "
            "(a field was edited, added or removed, or the proof was written by hand)"
        )
        return
    report.key_id = key_id


def verify_json_signature(proof: dict[str, Any], keys: PublicKeys, report: Report) -> None:
    block = proof.get("signature")
    if not isinstance(block, dict):
        report.problems.append("signature: the export is not signed (no signature block)")
        return
    if block.get("algorithm") != SIGNATURE_ALGORITHM:
        report.problems.append(f"signature: algorithm {block.get('algorithm')!r}, expected {SIGNATURE_ALGORITHM}")
        return
    verify_signature(
        signed=json_signed_bytes(proof), key_id=block.get("key_id"), value=block.get("value"), keys=keys, report=report
    )


def verify_csv_signature(text: str, keys: PublicKeys, report: Report) -> None:
    lines = text.replace("\r\n", "\n").rstrip("\n").split("\n")
    words = lines[-1].split(" ")
    if not lines[-1].startswith(CSV_SIGNATURE) or len(words) != 5:
        report.problems.append("signature: the export is not signed (its last line is not '# signature ...')")
        return
    if words[2] != SIGNATURE_ALGORITHM:
        report.problems.append(f"signature: algorithm {words[2]!r}, expected {SIGNATURE_ALGORITHM}")
        return
    signed = csv_signed_bytes("".join(f"{line}\n" for line in lines[:-1]))
    verify_signature(signed=signed, key_id=words[3], value=words[4], keys=keys, report=report)


# --- The digests ----------------------------------------------------------------------


def stamp(value: str) -> str:
    """An RFC 3339 time as the operation id hashes it (UTC, ``Z``)."""
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError(f"time without a zone: {value!r}")
    return parsed.astimezone(UTC).isoformat().replace("+00:00", "Z")


def moment(value: str) -> datetime:
    return datetime.fromisoformat(stamp(value).replace("Z", "+00:00"))


KEY_TEXT = re.compile(r"^(\d+|[0-9a-fA-F-]{32,36})?$")


def partition_of(partition: dict[str, Any]) -> str:
    """The partition's part of an operation id: the property id, or
    ``portfolio-<id>`` for a kind without a property (no property id)."""
    prop = partition.get("property_id")
    if prop is None or prop == "":
        return f"portfolio-{partition['portfolio_id']}"
    # An integer key (a number in JSON, digits in a CSV) in decimal; a UUID's (a string key's) text as it is.
    return str(int(prop)) if isinstance(prop, int) or str(prop).isdigit() else str(prop)


def after_of(value: Any) -> str:
    """The cursor as the id hashes it: an integer, or a key's text ("" — "-" in a CSV — before the first batch)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    text = "" if value == "-" else str(value)
    if not KEY_TEXT.match(text):
        raise ValueError(f"after_id {value!r} is neither an integer nor a key")
    return str(int(text)) if text.isdigit() and len(text) < 20 else text


def operation_id(
    *, record_kind: str, property_id: int | str, slot: str, cutoff: str, after_id: int | str, limit: int
) -> str:
    raw = f"retention:{record_kind}:{property_id}:{stamp(slot)}:{stamp(cutoff)}:{after_id}:{limit}"
    return hashlib.sha256(raw.encode()).hexdigest()


def job_digest(operation_ids: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(operation_ids)).encode()).hexdigest()


def sweep_digest(job_digests: list[str]) -> str:
    return hashlib.sha256("\n".join(job_digests).encode()).hexdigest()


def table_partition_id(
    *, record_kind: str, table: str, table_partition: str, lower: str | None, upper: str, slot: str
) -> str:
    low = stamp(lower) if lower and lower != "-" else "-"
    raw = f"table_partition:{record_kind}:{table}:{table_partition}:{low}:{stamp(upper)}:{stamp(slot)}"
    return hashlib.sha256(raw.encode()).hexdigest()


def verify_table_partitions(proof: dict[str, Any], report: Report) -> None:
    for drop in proof.get("table_partitions") or []:
        name = drop.get("table_partition")
        report.table_partitions += 1
        try:
            value = table_partition_id(
                record_kind=str(drop["record_kind"]),
                table=str(drop["table"]),
                table_partition=str(name),
                lower=drop.get("lower_bound"),
                upper=str(drop["upper_bound"]),
                slot=str(proof["slot"]),
            )
            portfolios = drop.get("portfolios") or {}
            rows = sum(int(p["rows"]) for p in portfolios.values())
            early = [k for k, p in portfolios.items() if moment(p["cutoff"]) < moment(drop["upper_bound"])]
        except (KeyError, TypeError, ValueError) as exc:
            report.problems.append(f"table partition {name}: its inputs cannot be read ({exc})")
            continue
        if value != drop.get("operation_id"):
            report.problems.append(
                f"table partition {name}: operation id recomputes to {value}, "
                f"the export says {drop.get('operation_id')}"
            )
        if rows != int(drop.get("rows", -1)):
            report.problems.append(
                f"table partition {name}: {drop.get('rows')} rows stated, its portfolios' sum {rows}"
            )
        for key in early:
            report.problems.append(f"table partition {name}: portfolio {key}'s cutoff is before its upper bound")


# --- The ledger's hash chains -----------------------------------------------------------
#
# The formulas the database's trigger computes as it inserts a row
# (``cleanup_ops.ledger_chain``: the protocol), written out here so an auditor
# recomputes a proof's ledger rows offline; ``cleanup_ops.ledger_chain``
# imports them from here, and the tests check them against the database's.

LEDGER_CHAIN_METHOD = (
    "entry_hash = sha256 hex of the UTF-8 of the row's parts, each as <length>:<text>; (a NULL as -;), "
    "in the order ledger-entry-v1, id, prev_id, prev_hash, operation_id, job_id, portfolio_id, property_id, "
    "record_kind, policy_version_id, cutoff, after_id, last_id, after_key, last_key, batch_limit, candidates, "
    "rows_deleted, rows_held, applied_at (times UTC as YYYY-MM-DDTHH:MM:SS.ffffffZ); prev_id and prev_hash "
    "are the previous row's of the same chain (portfolio:<id>), NULL and '' for its first; a chain's head is "
    "its last row's id and entry_hash"
)

LEDGER_ENTRY_PARTS = (
    "id",
    "prev_id",
    "prev_hash",
    "operation_id",
    "job_id",
    "portfolio_id",
    "property_id",
    "record_kind",
    "policy_version_id",
    "cutoff",
    "after_id",
    "last_id",
    "after_key",
    "last_key",
    "batch_limit",
    "candidates",
    "rows_deleted",
    "rows_held",
    "applied_at",
)

TABLE_PARTITION_DROP_PARTS = (
    "id",
    "prev_id",
    "prev_hash",
    "operation_id",
    "sweep_id",
    "record_kind",
    "table",
    "table_partition",
    "lower_bound",
    "upper_bound",
    "rows",
    "ids_digest",
    "portfolios",  # the jsonb's text as PostgreSQL spells it
    "slot",
    "dropped_at",
)


def chain_part(value: Any) -> str | None:
    """A field as the chain hashes it: a time in UTC with microseconds, an integer in decimal, text as is."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"time without a zone: {value!r}")
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, bool):
        raise ValueError(f"not a ledger field: {value!r}")
    return str(value)


def chain_text(parts: list[str | None]) -> str:
    """The canonical text: each part ``<length>:<text>;``, a NULL ``-;`` (no two lists spell one text)."""
    return "".join("-;" if part is None else f"{len(part)}:{part};" for part in parts)


def chain_hash(tag: str, names: tuple[str, ...], row: dict[str, Any]) -> str:
    parts = [tag, *(chain_part(row[name]) for name in names)]
    return hashlib.sha256(chain_text(parts).encode("utf-8")).hexdigest()


def ledger_entry_hash(row: dict[str, Any]) -> str:
    """A ``LedgerEntry`` row's ``entry_hash`` from its fields (``LEDGER_ENTRY_PARTS``)."""
    return chain_hash("ledger-entry-v1", LEDGER_ENTRY_PARTS, row)


def table_partition_drop_hash(row: dict[str, Any]) -> str:
    """A ``TablePartitionDrop`` row's ``entry_hash`` (``TABLE_PARTITION_DROP_PARTS``; ``portfolios`` as text)."""
    return chain_hash("table-partition-drop-v1", TABLE_PARTITION_DROP_PARTS, row)


def proof_ledger_row(partition: dict[str, Any], op: dict[str, Any]) -> dict[str, Any]:
    """The ledger row behind one of a proof's operations, as the chain hashes it: the job's
    fields, the operation's inputs and its ``ledger`` block. A text cursor (a non-integer
    key) is the row's ``after_key``/``last_key``, its bigints then 0."""
    ledger = op["ledger"]
    text_key = isinstance(op["last_id"], str)
    prop = partition.get("property_id")
    return {
        "id": int(ledger["id"]),
        "prev_id": None if ledger.get("prev_id") is None else int(ledger["prev_id"]),
        "prev_hash": ledger.get("prev_hash"),
        "operation_id": str(op["operation_id"]),
        "job_id": int(partition["job_id"]),
        # A number, or a UUID's (a string key's) text: the chain hashes either's text.
        "portfolio_id": partition["portfolio_id"],
        "property_id": None if prop is None or prop == "" else prop,
        "record_kind": str(partition["record_kind"]),
        "policy_version_id": int(ledger["policy_version_id"]),
        "cutoff": moment(str(op["cutoff"])),
        "after_id": 0 if text_key else int(op["after_id"]),
        "last_id": 0 if text_key else int(op["last_id"]),
        "after_key": str(op["after_id"]) if text_key else "",
        "last_key": str(op["last_id"]) if text_key else "",
        "batch_limit": int(op["limit"]),
        "candidates": int(ledger["candidates"]),
        "rows_deleted": int(ledger["rows_deleted"]),
        "rows_held": int(ledger["rows_held"]),
        "applied_at": moment(str(ledger["applied_at"])),
        "entry_hash": str(ledger["hash"]),
    }


def verify_ledger_chain(proof: dict[str, Any], report: Report) -> None:
    """The proof's ledger rows against the chain heads it names (``ledger_heads``): each row's
    hash recomputes, each row whose previous row is in the proof names that row's hash, and each
    chain's last row in the proof is its head. A proof that carries no rows (a CSV, an older
    export) has its heads checked by the signature alone."""
    heads = {str(h["chain"]): h for h in proof.get("ledger_heads") or []}
    chains: dict[str, list[dict[str, Any]]] = {}
    for partition in proof.get("partitions") or []:
        for op in partition.get("operation_inputs") or []:
            if "ledger" not in op:
                continue
            try:
                row = proof_ledger_row(partition, op)
            except (KeyError, TypeError, ValueError) as exc:
                report.problems.append(f"job {partition.get('job_id')}: a ledger row cannot be read ({exc})")
                continue
            chains.setdefault(f"portfolio:{row['portfolio_id']}", []).append(row)
    if not chains:
        return
    for chain, rows in sorted(chains.items()):
        rows.sort(key=lambda r: r["id"])
        before: dict[str, Any] | None = None
        for row in rows:
            report.chained += 1
            value = ledger_entry_hash(row)
            if value != row["entry_hash"]:
                report.problems.append(
                    f"ledger row {row['id']} ({chain}): hash recomputes to {value}, the export says {row['entry_hash']}"
                )
            if before is not None and row["prev_id"] == before["id"] and row["prev_hash"] != before["entry_hash"]:
                report.problems.append(
                    f"ledger row {row['id']} ({chain}): its previous hash is not row {before['id']}'s"
                )
            if before is not None and (row["prev_id"] is None or row["prev_id"] < before["id"]):
                report.problems.append(
                    f"ledger row {row['id']} ({chain}): it follows row {row['prev_id']}, "
                    f"not row {before['id']} or a later one (reordered)"
                )
            before = row
        head = heads.pop(chain, None)
        last = rows[-1]
        if head is None:
            report.problems.append(f"{chain}: the proof names no chain head for its ledger rows")
        elif str(head.get("entry_id")) != str(last["id"]) or head.get("entry_hash") != last["entry_hash"]:
            report.problems.append(
                f"{chain}: the head named is row {head.get('entry_id')} {head.get('entry_hash')}, "
                f"the proof's last ledger row is {last['id']} {last['entry_hash']}"
            )
    for chain, head in sorted(heads.items()):
        if chain.startswith("portfolio:"):
            report.problems.append(f"{chain}: a head is named (row {head.get('entry_id')}) but no ledger row of it")


@dataclass
class Report:
    jobs: int = 0
    operations: int = 0
    table_partitions: int = 0
    chained: int = 0  # ledger rows recomputed and linked to the heads named
    key_id: str | None = None  # the key the signature verified under
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        verdict = "verified" if self.ok else f"FAILED ({_n(len(self.problems), 'problem')})"
        drops = f"{_n(self.table_partitions, 'table partition drop')}, " if self.table_partitions else ""
        signed = f"signature valid under key {self.key_id}; " if self.key_id else ""
        chained = f", {_n(self.chained, 'ledger row')} chained to their heads" if self.chained else ""
        return (
            f"{verdict}: {signed}{_n(self.jobs, 'job digest')}, {drops}{_n(self.operations, 'operation id')} recomputed"
            f"{chained}"
        )


def verify(proof: dict[str, Any], *, keys: PublicKeys) -> Report:
    """A parsed JSON proof: its signature under one of ``keys``, then every digest."""
    report = Report()
    verify_json_signature(proof, keys, report)
    verify_digests_read(proof, report)
    return report


def verify_text(text: str, *, keys: PublicKeys, source: str = "the file") -> Report:
    """A proof export as downloaded, JSON or CSV: its signature, then every digest."""
    report = Report()
    try:
        proof = load(text)
        if not isinstance(proof, dict):
            raise ValueError("not a JSON object")
    except (ValueError, KeyError) as exc:
        return Report(problems=[f"{source}: not a readable proof export ({exc})"])
    if text.lstrip().startswith("{"):
        verify_json_signature(proof, keys, report)
    else:
        verify_csv_signature(text, keys, report)
    verify_digests_read(proof, report)
    return report


def verify_digests_read(proof: dict[str, Any], report: Report) -> None:
    # An edited file may not have the shape the digests are read from: that is a problem, not a crash.
    try:
        verify_digests(proof, report)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        report.problems.append(f"the export's fields cannot be read ({type(exc).__name__}: {exc})")


def verify_totals(proof: dict[str, Any], report: Report) -> None:
    """The sweep's figures against its jobs' (the signature covers them; these say which one differs)."""
    partitions = proof.get("partitions") or []
    try:
        stated = {
            "jobs": (proof.get("jobs"), len(partitions)),
            "rows_deleted": (proof.get("rows_deleted"), sum(int(p["rows_deleted"]) for p in partitions)),
            "table_partition_rows": (
                proof.get("table_partition_rows"),
                sum(int(d["rows"]) for d in proof.get("table_partitions") or []),
            ),
        }
    except (KeyError, TypeError, ValueError) as exc:
        report.problems.append(f"sweep: its jobs' figures cannot be read ({exc})")
        return
    for name, (claim, total) in stated.items():
        # The CSV states only rows_deleted (on its "# sweep" line); a figure it does not state is not compared.
        if claim is not None and str(claim) != str(total):
            report.problems.append(f"sweep: {name} is {claim}, its jobs' sum {total}")


def verify_digests(proof: dict[str, Any], report: Report | None = None) -> Report:
    """Recompute every operation id and digest of a parsed proof (``load``); no signature."""
    report = report if report is not None else Report()
    slot = proof.get("slot")
    if not slot:
        report.problems.append("the export has no slot: it predates operation inputs and cannot be verified")
        return report
    digests: list[str] = []
    for partition in sorted(proof.get("partitions", []), key=lambda p: int(p["job_id"])):
        job = partition["job_id"]
        report.jobs += 1
        recomputed: list[str] = []
        inputs = partition.get("operation_inputs") or []
        for op in inputs:
            report.operations += 1
            try:
                value = operation_id(
                    record_kind=str(partition["record_kind"]),
                    property_id=partition_of(partition),
                    slot=str(slot),
                    cutoff=str(op["cutoff"]),
                    after_id=after_of(op["after_id"]),
                    limit=int(op["limit"]),
                )
            except (KeyError, TypeError, ValueError) as exc:
                report.problems.append(f"job {job}: an operation's inputs cannot be read ({exc})")
                continue
            if value != op.get("operation_id"):
                report.problems.append(
                    f"job {job}: the operation after id {op.get('after_id')} recomputes to {value}, "
                    f"the export says {op.get('operation_id')}"
                )
            recomputed.append(value)
        if int(partition.get("operations", len(inputs))) != len(inputs):
            report.problems.append(
                f"job {job}: {_n(int(partition.get('operations') or 0), 'operation')} stated, {len(inputs)} with inputs"
            )
        digest = job_digest(recomputed)
        if digest != partition.get("digest"):
            report.problems.append(
                f"job {job}: digest recomputes to {digest}, the export says {partition.get('digest')}"
            )
        digests.append(digest)
    verify_table_partitions(proof, report)
    verify_ledger_chain(proof, report)
    verify_totals(proof, report)
    total = sweep_digest(digests)
    if total != proof.get("digest"):
        report.problems.append(f"sweep: digest recomputes to {total}, the export says {proof.get('digest')}")
    return report


def load(text: str) -> dict[str, Any]:
    """A proof export, JSON or CSV (``cleanup_ops.proof.proof_csv``), as the JSON shape."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return json.loads(stripped)
    table = [line for line in text.splitlines() if not line.startswith("#")]
    partitions = [dict(row) for row in csv.DictReader(io.StringIO("\n".join(table)))]
    by_job = {str(p["job_id"]): p for p in partitions}
    for partition in partitions:
        partition["operation_inputs"] = []
    proof: dict[str, Any] = {"partitions": partitions, "table_partitions": []}
    drops: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        words = line.split()
        if words[:2] == ["#", "table_partition"] and len(words) == 10:
            kind, parent, name, lower, upper, rows, ids_digest, op_id = words[2:]
            drops[name] = {
                "record_kind": kind,
                "table": parent,
                "table_partition": name,
                "lower_bound": None if lower == "-" else lower,
                "upper_bound": upper,
                "rows": rows,
                "ids_digest": None if ids_digest == "-" else ids_digest,
                "operation_id": op_id,
                "portfolios": {},
            }
            proof["table_partitions"].append(drops[name])
        elif words[:2] == ["#", "table_partition_portfolio"] and len(words) == 7:
            name, portfolio_id, rows, version_id, cutoff = words[2:]
            if name not in drops:
                raise ValueError(f"a table_partition_portfolio line names {name}, which no table_partition line does")
            drops[name]["portfolios"][portfolio_id] = {"rows": rows, "policy_version_id": version_id, "cutoff": cutoff}
        elif words[:2] == ["#", "ledger_head"] and len(words) == 5:
            chain, entry_id, entry_hash = words[2:]
            proof.setdefault("ledger_heads", []).append(
                {"chain": chain, "entry_id": entry_id, "entry_hash": entry_hash}
            )
        if words[:2] == ["#", "sweep"] and "digest" in words:
            proof["digest"] = words[words.index("digest") + 1]
            if "rows_deleted" in words[:-1]:
                proof["rows_deleted"] = words[words.index("rows_deleted") + 1]
        elif words[:2] == ["#", "slot"] and len(words) == 3:
            proof["slot"] = words[2]
        elif words[:2] == ["#", "operation"] and len(words) == 8:
            job_id, after_id, last_id, limit, cutoff, op_id = words[2:]
            if job_id not in by_job:
                raise ValueError(f"an operation line names job {job_id}, which is not in the table")
            by_job[job_id]["operation_inputs"].append(
                {"after_id": after_id, "last_id": last_id, "limit": limit, "cutoff": cutoff, "operation_id": op_id}
            )
    return proof


def verify_file(path: str | Path, *, keys: PublicKeys) -> Report:
    try:
        # Bytes, not read_text: universal newlines would hide a lone CR from the signature check.
        text = Path(path).read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return Report(problems=[f"{path}: not a readable proof export ({exc})"])
    return verify_text(text, keys=keys, source=str(path))


def public_keys_read(paths: list[str]) -> PublicKeys:
    """Every key of every file given (a key set JSON or a PEM public key), by key id."""
    keys: PublicKeys = {}
    for path in paths:
        try:
            keys.update(public_keys_load(Path(path).read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise ValueError(f"{path}: not a public key or key set ({exc})") from exc
    return keys


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="proof_verify.py", description="Verify a proof of disposition offline.")
    parser.add_argument("file", help="a proof export, .json or .csv")
    parser.add_argument(
        "--public-key",
        action="append",
        required=True,
        help="the platform's published key set (JSON) or a PEM public key; repeat for several",
    )
    args = parser.parse_args(argv)
    try:
        keys = public_keys_read(args.public_key)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    report = verify_file(args.file, keys=keys)
    for problem in report.problems:
        print(problem)
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
