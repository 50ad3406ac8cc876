"""Verify a proof of disposition from the export alone (JSON or CSV).

An auditor holding only the file recomputes, for every job, each operation
id from its inputs (record kind, property, the sweep's slot, cutoff,
``after_id``, ``limit``), the job digest from those operation ids, and the
sweep digest from the job digests, and compares each with what the export
states. Nothing else is trusted: a stated operation id is only a claim that
the recomputation must match.

This module needs nothing but Python's standard library (no Django, no
database), so it also runs on its own: ``python cleanup_ops/proof_verify.py
FILE``. ``manage.py cleanup_proof_verify FILE`` is the same check. The
formula is written out here on purpose rather than imported from
``cleanup_ops.execution.batches``: the two are checked against each other by
the tests, and an auditor can read this one file whole.

Whole table partitions dropped (``table_partitions``): each drop's
operation id is recomputed from its inputs (record kind, table, table
partition, bounds, the slot), its rows must be the sum of its portfolios',
and no portfolio's cutoff may lie before its upper bound (a table partition is
dropped only when all of it is past every cutoff). ``ids_digest`` is stated
for an auditor who holds the ids (its formula:
``cleanup_ops.models.table_partitions``).

Exit status: 0 when every digest is recomputed identical; 1 otherwise, with
one line per problem naming the job and what differs.
"""

from __future__ import annotations

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
        return f"portfolio-{int(partition['portfolio_id'])}"
    return str(int(prop))


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


@dataclass
class Report:
    jobs: int = 0
    operations: int = 0
    table_partitions: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        verdict = "verified" if self.ok else f"FAILED ({len(self.problems)} problem(s))"
        drops = f"{self.table_partitions} table partition drop(s), " if self.table_partitions else ""
        return f"{verdict}: {self.jobs} job digest(s), {drops}{self.operations} operation id(s) recomputed"


def verify(proof: dict[str, Any]) -> Report:
    """Recompute every operation id and digest of a parsed proof (``load``)."""
    report = Report()
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
                f"job {job}: {partition.get('operations')} operation(s) stated, {len(inputs)} with inputs"
            )
        digest = job_digest(recomputed)
        if digest != partition.get("digest"):
            report.problems.append(
                f"job {job}: digest recomputes to {digest}, the export says {partition.get('digest')}"
            )
        digests.append(digest)
    verify_table_partitions(proof, report)
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
        if words[:2] == ["#", "sweep"] and "digest" in words:
            proof["digest"] = words[words.index("digest") + 1]
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


def verify_file(path: str | Path) -> Report:
    try:
        proof = load(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError) as exc:
        return Report(problems=[f"{path}: not a readable proof export ({exc})"])
    return verify(proof)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python proof_verify.py FILE (a proof export, .json or .csv)", file=sys.stderr)
        return 2
    report = verify_file(argv[0])
    for problem in report.problems:
        print(problem)
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
