"""Record kinds of other shapes than the demo's (tests/schema_b, "Record
shapes"): a UUID key, and the same pipeline — admission, the batch, holds,
the purge, the proof, the console and the API — running on every shape
unchanged in its guarantees.

The shapes' other features have modules of their own: a kind without a
property or reached through a join (``tests/test_record_shapes_property_paths.py``),
an unmanaged or a partitioned table (``tests/test_record_shapes_tables.py``).
"""

from __future__ import annotations

import uuid

import pytest
from django.core.exceptions import ValidationError

from cleanup_ops.execution.runner import cleanup_drain
from cleanup_ops.models import CleanupJob, DeletedAttachment, LedgerEntry, Sweep
from cleanup_ops.proof import proof_csv_sign, proof_sign, sweep_proof
from cleanup_ops.proof_keys import proof_public_keys
from cleanup_ops.proof_verify import verify, verify_digests, verify_text
from cleanup_ops.schedule import sweep_trigger
from retention.checks import check_kind
from retention.models import LegalHold
from retention.registry import get_spec
from retention.services import legal_hold_place
from tests.schema_b.models import Ticket

from . import record_shapes
from .conftest import make_records
from .record_shapes import NOW, OLD, SHAPES, SLOT, TICKET, YOUNG, buildings, notices, shape_records, tickets
from .test_api import client_for

# The fixtures, one definition for the record shapes' modules (tests/record_shapes.py).
shapes = record_shapes.shapes
clock = record_shapes.clock


# --- UUID keys ------------------------------------------------------------------


def test_a_uuid_key_passes_the_checks_and_casts_as_uuid(shapes):
    assert check_kind("ticket", TICKET) == []
    spec = get_spec("ticket")
    assert (spec.integer_key, spec.pk_sql_type, spec.key_start) == (False, "uuid", "")
    assert get_spec("lease").pk_sql_type == "bigint"


def test_a_key_neither_integer_nor_uuid_is_refused_naming_the_model(shapes):
    # A session's key is a CharField.
    entry = {"model": "sessions.Session", "timestamp": "expire_date"}
    (problem,) = [m for m in check_kind("session", entry) if m.id == "retention.E006"]
    assert "RETENTION_RECORD_KINDS['session']['model']" in problem.msg
    assert "neither an integer nor a UUID" in problem.msg


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_uuid_keyed_records_are_cleaned_in_keyset_batches_keeping_held_and_young_ones(
    shapes, settings, portfolio, active_policy, reviewer, docstore
):
    # Six partitions (more than the per-partition statements take: the
    # lateral group statement) and batches of 3 rows (the text cursor moves).
    settings.CLEANUP_BATCH_SIZE = 3
    active_policy(portfolio, "ticket", 30)
    sites = buildings(portfolio, 6)
    old = {site.pk: tickets(site, 7, at=OLD, documents=True) for site in sites}
    young = [key for site in sites for key in tickets(site, 2, at=YOUNG)]
    held = old[sites[2].pk][4]
    held_document = Ticket.objects.get(pk=held).document_id
    docstore.create(*Ticket.objects.exclude(document_id="").values_list("document_id", flat=True))
    hold = legal_hold_place(
        portfolio=portfolio, record_kind="ticket", record_id=str(held), placed_by=reviewer, reason="a claim on a ticket"
    )
    assert (hold.record_id, hold.record_key) == (None, get_spec("ticket").key_text(held))

    sweep_trigger(slot=SLOT, now=NOW)
    cleanup_drain()

    assert set(Ticket.objects.values_list("pk", flat=True)) == {held, *young}
    jobs = CleanupJob.objects.filter(record_kind="ticket", job_kind="delete")
    assert jobs.count() == 6 and sum(job.rows_deleted for job in jobs) == 6 * 7 - 1
    assert sum(job.rows_held for job in jobs) == 1
    ledger = LedgerEntry.objects.filter(record_kind="ticket").order_by("job_id", "id")
    assert all(entry.last_key and entry.after_id == entry.last_id == 0 for entry in ledger)
    first = {entry.job_id: entry for entry in reversed(ledger)}
    assert {entry.after_key for entry in first.values()} == {""}
    # Each batch starts where the one before it ended, on the job's text cursor.
    for job in jobs:
        entries = [entry for entry in ledger if entry.job_id == job.pk]
        assert [e.after_key for e in entries[1:]] == [e.last_key for e in entries[:-1]]
        assert job.cursor == 0 and job.cursor_key == entries[-1].last_key
    # The documents of the deleted tickets, and only those, are purged.
    assert docstore.documents() == {held_document}
    assert DeletedAttachment.objects.filter(record_kind="ticket", record_id__isnull=True).count() == 41
    assert not DeletedAttachment.objects.filter(record_kind="ticket", record_key="").exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_uuid_kind_and_an_integer_kind_share_a_batch_transaction_each_with_its_cursor(
    shapes, settings, portfolio, prop, active_policy
):
    settings.CLEANUP_BATCH_SIZE = 4
    active_policy(portfolio, "ticket", 30)
    active_policy(portfolio, "lease", 30)
    tickets(prop, 5, at=OLD)
    make_records(prop, "lease", 5, ended=OLD)

    sweep_trigger(slot=SLOT, now=NOW)
    cleanup_drain()

    assert not Ticket.objects.exists()
    lease_job = CleanupJob.objects.get(record_kind="lease", job_kind="delete")
    ticket_job = CleanupJob.objects.get(record_kind="ticket", job_kind="delete")
    assert (lease_job.rows_deleted, ticket_job.rows_deleted) == (5, 5)
    assert lease_job.cursor > 0 and lease_job.cursor_key == ""
    assert ticket_job.cursor == 0 and ticket_job.cursor_key
    assert LedgerEntry.objects.filter(record_kind="lease", after_key="", last_key="").count() == 2


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_the_proof_of_a_uuid_kind_recomputes_from_the_export_in_json_and_csv(
    shapes, settings, portfolio, active_policy
):
    settings.CLEANUP_BATCH_SIZE = 3
    active_policy(portfolio, "ticket", 30)
    for site in buildings(portfolio, 2):
        tickets(site, 5, at=OLD)
    sweep_trigger(slot=SLOT, now=NOW)
    cleanup_drain()

    proof = sweep_proof(sweep=Sweep.objects.get())
    inputs = [op for partition in proof["partitions"] for op in partition["operation_inputs"]]
    assert len(inputs) == 4 and {op["after_id"] for op in inputs} > {""}
    keys = proof_public_keys()
    assert verify(proof_sign(proof=proof), keys=keys).ok, verify(proof_sign(proof=proof), keys=keys).problems
    assert verify_text(proof_csv_sign(proof=proof), keys=keys).ok
    # A changed cursor is caught.
    inputs[1]["after_id"] = str(uuid.uuid4())
    assert not verify_digests(proof).ok


@pytest.mark.django_db
def test_a_record_hold_on_a_uuid_kind_names_the_uuid_and_a_wrong_type_is_refused_naming_the_field(
    shapes, portfolio, prop, reviewer
):
    (key,) = tickets(prop, 1, at=OLD)
    with pytest.raises(ValidationError) as wrong:
        legal_hold_place(
            portfolio=portfolio, record_kind="ticket", record_id="12", placed_by=reviewer, reason="a claim on it"
        )
    assert "a ticket's id is a UUID" in wrong.value.message_dict["record_id"][0]
    with pytest.raises(ValidationError) as integer:
        legal_hold_place(
            portfolio=portfolio, record_kind="lease", record_id=str(key), placed_by=reviewer, reason="a claim on it"
        )
    assert "a lease's id is an integer" in integer.value.message_dict["record_id"][0]
    with pytest.raises(ValidationError, match="there is no ticket"):
        legal_hold_place(
            portfolio=portfolio, record_kind="ticket", record_id=str(uuid.uuid4()), placed_by=reviewer, reason="x" * 12
        )
    assert not LegalHold.objects.exists()

    api = client_for(reviewer)
    placed = api.post(
        "/api/v1/legal-holds/",
        {"portfolio": portfolio.pk, "record_kind": "ticket", "record_id": str(key), "reason": "a claim on a ticket"},
        format="json",
    )
    assert placed.status_code == 201, placed.json()
    # The key as the database spells it as text (PostgreSQL: hyphenated).
    assert placed.json()["record_id"] == get_spec("ticket").key_text(key)
    assert LegalHold.objects.get().record_key == get_spec("ticket").key_text(key)
    refused = api.post(
        "/api/v1/legal-holds/",
        {"portfolio": portfolio.pk, "record_kind": "ticket", "record_id": 7, "reason": "a claim on a ticket"},
        format="json",
    )
    assert refused.status_code == 400 and "UUID" in str(refused.json()["record_id"])


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_the_console_the_api_and_the_debt_figures_show_the_shapes_jobs(
    shapes, client, portfolio, prop, active_policy, operator_user
):
    from cleanup_ops.console_selectors.overview import retention_debt

    for kind in SHAPES:
        active_policy(portfolio, kind, 30)
    notices(portfolio, 3, at=OLD)
    notices(portfolio, 1, at=YOUNG)
    tickets(prop, 2, at=OLD)
    debt = {row["record_kind"]: row for row in retention_debt(now=NOW)}
    sweep = sweep_trigger(slot=SLOT, now=NOW).sweep
    assert (debt["notice"]["overdue"], debt["ticket"]["overdue"]) == (3, 2)
    client.force_login(operator_user)
    jobs = CleanupJob.objects.filter(record_kind__in=list(SHAPES))
    pages = ["/console/", f"/console/sweeps/{sweep.pk}/", "/console/jobs/"] + [f"/console/jobs/{j.pk}/" for j in jobs]
    cleanup_drain()
    pages.append(f"/console/sweeps/{sweep.pk}/proof.csv")
    for page in pages:
        assert client.get(page).status_code == 200, page
    listed = client_for(operator_user).get("/api/v1/jobs/")
    assert listed.status_code == 200


# --- The guarantees on every shape ----------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
@pytest.mark.parametrize(
    "kind",
    SHAPES,
)
def test_on_every_shape_a_replay_from_an_older_cursor_deletes_nothing_twice_and_keeps_held_and_young_rows(
    kind, shapes, portfolio, prop, active_policy, reviewer
):
    from cleanup_ops.execution.batches import job_load, run_batch
    from cleanup_ops.execution.leases import job_lease
    from cleanup_ops.models import JobState

    active_policy(portfolio, kind, 30)
    shape_records(kind, prop, 10, at=OLD)
    shape_records(kind, prop, 2, at=YOUNG)
    model = get_spec(kind).model
    young = set(model.objects.filter(**{f"{get_spec(kind).timestamp_field}__gte": YOUNG}).values_list("pk", flat=True))
    held = sorted(set(model.objects.values_list("pk", flat=True)) - young)[5]
    legal_hold_place(
        portfolio=portfolio, record_kind=kind, record_id=str(held), placed_by=reviewer, reason="a held row of the shape"
    )
    sweep_trigger(slot=SLOT, now=NOW)
    job = CleanupJob.objects.get(record_kind=kind, job_kind="delete")
    ref = job_load(job.pk)

    def batch(limit: int) -> None:
        lease = job_lease(job_id=job.pk, owner="w")
        assert lease is not None
        run_batch(job=ref, lease=lease, limit=limit)
        CleanupJob.objects.filter(pk=job.pk).update(state=JobState.PENDING, lease_token=None, lease_expires_at=None)

    def rewind() -> None:
        CleanupJob.objects.filter(pk=job.pk).update(cursor=0, cursor_key="")

    batch(4)
    rewind()  # a redrive from an older cursor, with another batch size: a new operation
    batch(6)
    rewind()
    batch(4)  # the first operation again: replayed from the ledger, not applied
    for _ in range(3):
        batch(4)
    entries = list(LedgerEntry.objects.filter(record_kind=kind).order_by("id"))
    assert len({entry.operation_id for entry in entries}) == len(entries)
    assert sum(entry.rows_deleted for entry in entries) == 9
    assert all(entry.rows_deleted <= entry.candidates for entry in entries)
    assert sum(entry.rows_held for entry in entries) >= 1
    assert set(model.objects.values_list("pk", flat=True)) == {held, *young}
