"""The operation id's arithmetic, without a database: what a batch's id is a hash
of (``cleanup_ops.execution.batches.operation_id``), and that the auditor's own
copy of the formula (``cleanup_ops.proof_verify``, standard library and ``cryptography`` only)
computes the same id from an export's text. The ids of real ledger rows are
checked against the verifier in tests/test_proof_verify.py.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cleanup_ops import proof_verify
from cleanup_ops.execution.batches import operation_id, operation_partition

pytestmark = pytest.mark.unit

SLOT = datetime(2026, 8, 21, 2, 0, tzinfo=UTC)
CUTOFF = datetime(2025, 8, 21, 2, 0, tzinfo=UTC)
BATCH = {"record_kind": "lease", "property_id": 42, "slot": SLOT, "cutoff": CUTOFF, "after_id": 1000, "limit": 250}


def test_an_operation_id_is_the_sha256_of_the_documented_fields_in_rfc_3339_utc():
    raw = "retention:lease:42:2026-08-21T02:00:00Z:2025-08-21T02:00:00Z:1000:250"
    assert operation_id(**BATCH) == hashlib.sha256(raw.encode()).hexdigest()


def test_the_first_batch_hashes_an_empty_cursor():
    raw = "retention:lease:42:2026-08-21T02:00:00Z:2025-08-21T02:00:00Z::250"
    assert operation_id(**{**BATCH, "after_id": ""}) == hashlib.sha256(raw.encode()).hexdigest()


def test_the_same_instants_in_another_zone_give_the_same_id():
    cest = timezone(timedelta(hours=2))
    assert operation_id(**{**BATCH, "slot": SLOT.astimezone(cest), "cutoff": CUTOFF.astimezone(cest)}) == operation_id(
        **BATCH
    )


@pytest.mark.parametrize(
    "change",
    [
        {"record_kind": "maintenance_record"},
        {"property_id": 43},
        {"slot": SLOT + timedelta(days=1)},
        {"cutoff": CUTOFF + timedelta(seconds=1)},
        {"after_id": 1001},
        {"limit": 251},
    ],
    ids=lambda change: next(iter(change)),
)
def test_each_field_changes_the_id(change):
    assert operation_id(**{**BATCH, **change}) != operation_id(**BATCH)


def test_a_later_sweep_with_an_equal_cutoff_never_replays_an_earlier_sweeps_batches():
    # A policy shortened by exactly the time between the slots: same cutoff, new slot.
    later = {**BATCH, "slot": SLOT + timedelta(days=1)}
    assert operation_id(**later) != operation_id(**BATCH)


def test_a_partition_is_its_property_or_its_portfolio_when_the_kind_has_no_property():
    assert operation_partition(property_id=42, portfolio_id=7) == "42"
    assert operation_partition(property_id=None, portfolio_id=7) == "portfolio-7"


def test_two_portfolios_batches_of_a_kind_without_property_never_share_an_id():
    ids = {
        operation_id(**{**BATCH, "property_id": operation_partition(property_id=None, portfolio_id=p)}) for p in (7, 8)
    }
    assert len(ids) == 2


def test_a_portfolio_partition_never_equals_a_property_one_of_the_same_number():
    assert operation_partition(property_id=None, portfolio_id=7) != operation_partition(property_id=7, portfolio_id=1)


# --- The verifier's copy of the formula --------------------------------------------------


def test_the_verifier_computes_the_same_id_from_the_exports_text():
    assert proof_verify.operation_id(
        record_kind="lease",
        property_id=42,
        slot="2026-08-21T02:00:00Z",
        cutoff="2025-08-21T02:00:00+00:00",
        after_id=1000,
        limit=250,
    ) == operation_id(**BATCH)


def test_the_verifier_reads_a_time_with_an_offset_as_the_same_instant():
    assert proof_verify.stamp("2026-08-21T04:00:00+02:00") == "2026-08-21T02:00:00Z"


def test_the_verifier_refuses_a_time_without_a_zone():
    with pytest.raises(ValueError, match="without a zone"):
        proof_verify.stamp("2026-08-21T02:00:00")


def test_the_verifier_names_the_partition_as_the_ledger_does():
    assert proof_verify.partition_of({"property_id": 42, "portfolio_id": 7}) == "42"
    assert proof_verify.partition_of({"property_id": "", "portfolio_id": "7"}) == "portfolio-7"
    assert proof_verify.partition_of({"property_id": None, "portfolio_id": 7}) == "portfolio-7"


@pytest.mark.parametrize(
    ("value", "hashed"),
    [(1000, "1000"), ("1000", "1000"), ("0042", "42"), ("-", ""), ("", "")],
)
def test_the_verifier_reads_a_cursor_as_the_id_hashes_it(value, hashed):
    assert proof_verify.after_of(value) == hashed


def test_the_verifier_keeps_a_uuid_cursor_as_its_text():
    key = "0f8fad5b-d9cb-469f-a165-70867728950e"
    assert proof_verify.after_of(key) == key


@pytest.mark.parametrize("value", ["ten", "1e3", True, "12 34"])
def test_the_verifier_refuses_a_cursor_that_is_neither_an_integer_nor_a_key(value):
    with pytest.raises(ValueError, match="neither an integer nor a key"):
        proof_verify.after_of(value)


def test_a_job_digest_does_not_depend_on_the_order_of_its_operation_ids():
    ids = [operation_id(**{**BATCH, "after_id": after}) for after in ("", 250, 500)]
    assert proof_verify.job_digest(ids) == proof_verify.job_digest(list(reversed(ids)))


def test_a_sweep_digest_depends_on_the_order_of_its_job_digests():
    a, b = proof_verify.job_digest(["a"]), proof_verify.job_digest(["b"])
    assert proof_verify.sweep_digest([a, b]) != proof_verify.sweep_digest([b, a])


@given(
    kind=st.sampled_from(["lease", "maintenance_record", "tenant_activity", "meter_reading"]),
    property_id=st.integers(min_value=1, max_value=10**12),
    slot=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
    age=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=3650)),
    offset=st.integers(min_value=-12 * 60, max_value=14 * 60),
    after_id=st.one_of(st.just(""), st.integers(min_value=0, max_value=2**63 - 1)),
    limit=st.integers(min_value=1, max_value=10_000),
)
def test_the_verifier_and_the_ledger_agree_on_any_batch(kind, property_id, slot, age, offset, after_id, limit):
    cutoff = slot - age
    zone = timezone(timedelta(minutes=offset))
    ours = operation_id(
        record_kind=kind, property_id=property_id, slot=slot, cutoff=cutoff, after_id=after_id, limit=limit
    )
    theirs = proof_verify.operation_id(
        record_kind=kind,
        property_id=property_id,
        slot=slot.astimezone(zone).isoformat(),
        cutoff=cutoff.astimezone(zone).isoformat(),
        after_id=proof_verify.after_of(after_id if after_id != "" else "-"),
        limit=limit,
    )
    assert ours == theirs
