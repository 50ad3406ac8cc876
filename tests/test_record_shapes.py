"""Record kinds of other shapes than the demo's (tests/schema_b, "Record
shapes"): a UUID key, and the same pipeline — admission, the batch, holds,
the purge, the proof — running on them unchanged in its guarantees."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction

from cleanup_ops.admission import sweep_preview
from cleanup_ops.execution.runner import cleanup_drain
from cleanup_ops.models import CleanupJob, DeletedAttachment, JobOutcome, LedgerEntry, Sweep
from cleanup_ops.proof import proof_csv, sweep_proof
from cleanup_ops.proof_verify import load, verify
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property
from retention.checks import check_kind, unreachable_records_check
from retention.models import LegalHold
from retention.registry import DEFAULT_RECORD_KINDS, get_spec, registry_reload
from retention.services import legal_hold_place
from tests.schema_b.models import MeterReading, Notice, Ticket, Unit, Visit

from .conftest import make_records, utc
from .test_api import client_for

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2026-05-01T00:00:00Z")  # past a 30-day cutoff
YOUNG = utc("2026-08-15T00:00:00Z")

TICKET = {
    "model": "schema_b.Ticket",
    "label": "Ticket",
    "timestamp": "resolved_at",
    "portfolio": "customer",
    "property": "building",
    "attachment": {"field": "document_id"},
}


NOTICE = {
    "model": "schema_b.Notice",
    "label": "Notice",
    "timestamp": "sent_at",
    "portfolio": "customer",
    "property": None,
    "attachment": {"field": "document_id"},
}
VISIT = {
    "model": "schema_b.Visit",
    "label": "Visit",
    "timestamp": "visited_at",
    "portfolio": "customer",
    "property": "unit__building",
}
CHARGE = {
    "model": "schema_b.LegacyCharge",
    "label": "Legacy charge",
    "timestamp": "billed_at",
    "portfolio": "customer",
    "property": "building",
}
READING = {
    "model": "schema_b.MeterReading",
    "label": "Meter reading",
    "timestamp": "read_at",
    "portfolio": "customer",
    "property": "building",
}
SHAPES = {"ticket": TICKET, "notice": NOTICE, "visit": VISIT, "legacy_charge": CHARGE, "meter_reading": READING}


@pytest.fixture
def shapes(settings) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """The demo's kinds and the shapes' kinds, for one test."""
    settings.RETENTION_RECORD_KINDS = {**DEFAULT_RECORD_KINDS, **SHAPES}
    registry_reload()
    yield
    del settings.RETENTION_RECORD_KINDS
    registry_reload()


@pytest.fixture
def clock(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    return time_machine


def tickets(building: Property, count: int, *, at: datetime, documents: bool = False) -> list[uuid.UUID]:
    rows = [
        Ticket(
            customer_id=building.portfolio_id,
            building=building,
            resolved_at=at + timedelta(minutes=i),
            document_id=f"ticket-doc-{building.pk}-{at:%m%d}-{i}" if documents else "",
        )
        for i in range(count)
    ]
    Ticket.objects.bulk_create(rows)
    return [row.pk for row in rows]


def buildings(portfolio: Portfolio, count: int) -> list[Property]:
    return [Property.objects.create(portfolio=portfolio, name=f"Building {i}") for i in range(count)]


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
    assert verify(proof).ok, verify(proof).problems
    assert verify(load(proof_csv(proof))).ok
    # A changed cursor is caught.
    inputs[1]["after_id"] = str(uuid.uuid4())
    assert not verify(proof).ok


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


# --- No property ----------------------------------------------------------------


def notices(portfolio: Portfolio, count: int, *, at: datetime, documents: bool = False) -> list[int]:
    rows = [
        Notice(
            customer=portfolio,
            sent_at=at + timedelta(minutes=i),
            document_id=f"notice-doc-{portfolio.pk}-{at:%m%d}-{i}" if documents else "",
        )
        for i in range(count)
    ]
    return [row.pk for row in Notice.objects.bulk_create(rows)]


def test_a_kind_without_a_property_passes_the_checks_with_its_portfolio_keyset_index(shapes):
    assert check_kind("notice", NOTICE) == []
    assert get_spec("notice").keyset_index_fields() == ["customer", "id"]


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_kind_without_a_property_is_partitioned_by_portfolio_and_honours_portfolio_and_record_holds(
    shapes, settings, active_policy, reviewer, docstore
):
    settings.CLEANUP_BATCH_SIZE = 3
    first = Portfolio.objects.create(name="First", slug="first")
    second = Portfolio.objects.create(name="Second", slug="second")
    held_whole = Portfolio.objects.create(name="Held", slug="held")
    for portfolio in (first, second, held_whole):
        active_policy(portfolio, "notice", 30)
    old_first = notices(first, 7, at=OLD, documents=True)
    notices(second, 7, at=OLD)
    kept = notices(held_whole, 4, at=OLD)
    young = notices(first, 2, at=YOUNG)
    docstore.create(*Notice.objects.exclude(document_id="").values_list("document_id", flat=True))
    legal_hold_place(
        portfolio=first, record_kind="notice", record_id=old_first[3], placed_by=reviewer, reason="one notice kept"
    )
    legal_hold_place(portfolio=held_whole, record_kind="notice", placed_by=reviewer, reason="every notice kept")

    sweep_trigger(slot=SLOT, now=NOW)
    cleanup_drain()

    assert set(Notice.objects.values_list("pk", flat=True)) == {old_first[3], *kept, *young}
    jobs = {job.portfolio_id: job for job in CleanupJob.objects.filter(record_kind="notice", job_kind="delete")}
    assert {job.property_id for job in jobs.values()} == {None}
    assert all(job.key.endswith(f":{job.portfolio_id}:-:notice") for job in jobs.values())
    # The two portfolios' batches have the same slot, cutoff, cursor and limit:
    # only the partition tells their operation ids apart, so both deleted.
    assert (jobs[first.pk].rows_deleted, jobs[first.pk].rows_held) == (6, 1)
    assert (jobs[second.pk].rows_deleted, jobs[second.pk].outcome) == (7, JobOutcome.DELETED)
    assert (jobs[held_whole.pk].rows_held, jobs[held_whole.pk].outcome) == (4, JobOutcome.HELD)
    assert set(LedgerEntry.objects.filter(record_kind="notice").values_list("property_id", flat=True)) == {None}
    assert docstore.documents() == {Notice.objects.get(pk=old_first[3]).document_id}
    proof = sweep_proof(sweep=Sweep.objects.get())
    assert verify(proof).ok and verify(load(proof_csv(proof))).ok


@pytest.mark.django_db
def test_a_property_hold_cannot_be_placed_on_a_kind_without_a_property(shapes, portfolio, prop, reviewer):
    with pytest.raises(ValidationError) as refused:
        legal_hold_place(
            portfolio=portfolio, property=prop, record_kind="notice", placed_by=reviewer, reason="a building's notices"
        )
    assert "belongs to no property" in refused.value.message_dict["property"][0]
    assert not LegalHold.objects.exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_portfolio_partition_has_at_most_one_open_delete_job(shapes, portfolio, active_policy):
    active_policy(portfolio, "notice", 30)
    notices(portfolio, 3, at=OLD)
    sweep_trigger(slot=SLOT, now=NOW)
    job = CleanupJob.objects.get(record_kind="notice")
    # A later sweep while it is still open: carried over, not admitted twice.
    later = sweep_trigger(slot=SLOT + timedelta(days=1), now=NOW + timedelta(days=1))
    assert CleanupJob.objects.filter(record_kind="notice").count() == 1
    assert Sweep.objects.get(pk=later.sweep.pk).carried_over == 1
    # And whoever else would insert one, the database refuses it.
    fields = {f: getattr(job, f) for f in ("portfolio_id", "record_kind", "policy_version_id", "cutoff", "sweep_id")}
    with pytest.raises(IntegrityError), transaction.atomic():
        CleanupJob.objects.create(key="another", property_id=None, available_at=NOW, **fields)


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


# --- A one-hop property path ----------------------------------------------------


def visits(unit: Unit | None, portfolio: Portfolio, count: int, *, at: datetime) -> list[int]:
    rows = [Visit(customer=portfolio, unit=unit, visited_at=at + timedelta(minutes=i)) for i in range(count)]
    return [row.pk for row in Visit.objects.bulk_create(rows)]


def test_a_one_hop_path_passes_the_checks_and_a_wrong_one_is_refused_naming_the_property(shapes):
    assert check_kind("visit", VISIT) == []
    assert get_spec("visit").keyset_index_fields() == ["unit", "id"]
    for wrong, words in [
        ("unit__name", "is not a foreign key (the second hop of 'unit__name')"),
        ("customer__building", "has no field 'building'"),
        ("unit__building__portfolio", "one hop is supported"),
        ("visited_at__building", "is not a foreign key (the first hop"),
    ]:
        (problem,) = check_kind("visit", {**VISIT, "property": wrong})
        assert problem.id == "retention.E005"
        assert "RETENTION_RECORD_KINDS['visit']['property']" in problem.msg and words in problem.msg, problem.msg


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_kind_reached_through_its_unit_is_partitioned_held_and_deleted_through_the_join(
    shapes, settings, portfolio, active_policy, reviewer
):
    settings.CLEANUP_BATCH_SIZE = 3
    active_policy(portfolio, "visit", 30)
    sites = buildings(portfolio, 6)  # more than the per-partition statements: the lateral one too
    units = {site.pk: [Unit.objects.create(building=site), Unit.objects.create(building=site)] for site in sites}
    old = {
        site.pk: visits(units[site.pk][0], portfolio, 3, at=OLD) + visits(units[site.pk][1], portfolio, 2, at=OLD)
        for site in sites
    }
    young = visits(units[sites[0].pk][0], portfolio, 2, at=YOUNG)
    orphan_unit = Unit.objects.create(building=None)
    nowhere = visits(orphan_unit, portfolio, 2, at=OLD) + visits(None, portfolio, 1, at=OLD)
    held_site = sites[1]
    legal_hold_place(portfolio=portfolio, property=held_site, placed_by=reviewer, reason="a building under a claim")
    held_one = old[sites[0].pk][1]
    legal_hold_place(
        portfolio=portfolio,
        property=sites[0],
        record_kind="visit",
        record_id=held_one,
        placed_by=reviewer,
        reason="one visit under a claim",
    )
    # Moved into the held building before the sweep: held through its new unit's building.
    moved = old[sites[2].pk][0]
    Visit.objects.filter(pk=moved).update(unit=units[held_site.pk][0])

    preview = {row.record_kind: row for row in sweep_preview(slot=SLOT, portfolio_id=portfolio.pk).rows}
    assert (preview["visit"].expired, preview["visit"].held, preview["visit"].unreachable) == (30, 7, 3)
    sweep_trigger(slot=SLOT, now=NOW)
    cleanup_drain()

    kept = {held_one, *old[held_site.pk], moved, *young, *nowhere}
    assert set(Visit.objects.values_list("pk", flat=True)) == kept
    jobs = {job.property_id: job for job in CleanupJob.objects.filter(record_kind="visit", job_kind="delete")}
    assert set(jobs) == {site.pk for site in sites}  # none for the visits that reach no property
    assert (jobs[held_site.pk].rows_held, jobs[held_site.pk].outcome) == (6, JobOutcome.HELD)
    assert (jobs[sites[0].pk].rows_deleted, jobs[sites[0].pk].rows_held) == (4, 1)
    assert jobs[sites[2].pk].rows_deleted == 4
    assert sum(job.rows_deleted for job in jobs.values()) == 30 - 7
    # The visits that reach no property are reported, not kept in silence.
    (warning,) = unreachable_records_check(databases=["default"])
    assert warning.id == "retention.W009" and "3 row(s) of schema_b.Visit" in warning.msg


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_the_dry_run_command_reports_the_rows_a_null_path_keeps(shapes, portfolio, prop, active_policy):
    from io import StringIO

    from django.core.management import call_command

    active_policy(portfolio, "visit", 30)
    visits(Unit.objects.create(building=prop), portfolio, 2, at=OLD)
    visits(None, portfolio, 4, at=OLD)
    out = StringIO()
    call_command("cleanup_sweep", "--dry-run", "--slot", "2026-08-21T02:00Z", stdout=out)
    assert f"Portfolio {portfolio.pk}, visit: 4 rows past the cutoff belong to no property" in out.getvalue()


# --- An unmanaged model over a table made in SQL ---------------------------------


def legacy_charges(building: Property, count: int, *, at: datetime) -> None:
    """Rows written as the other application writes them: plain SQL."""
    with connection.cursor() as cursor:
        for i in range(count):
            cursor.execute(
                "INSERT INTO legacy_charges (account_ref, site_ref, billed) VALUES (%s, %s, %s)",
                [building.portfolio_id, building.pk, at + timedelta(minutes=i)],
            )


@pytest.mark.django_db
def test_an_unmanaged_tables_keyset_index_is_found_in_the_database_not_the_model(shapes):
    assert check_kind("legacy_charge", CHARGE) == []
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX legacy_charges_keyset")
    (problem,) = check_kind("legacy_charge", CHARGE)
    # Not ours to change: a warning with the index to create, not an error.
    assert problem.id == "retention.W008" and "(or create it on the table)" in problem.hint


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_an_unmanaged_model_over_a_sql_table_is_cleaned_by_the_same_pipeline(
    shapes, settings, portfolio, active_policy, reviewer
):
    settings.CLEANUP_BATCH_SIZE = 4
    active_policy(portfolio, "legacy_charge", 30)
    open_site, held_site = buildings(portfolio, 2)
    legacy_charges(open_site, 9, at=OLD)
    legacy_charges(open_site, 2, at=YOUNG)
    legacy_charges(held_site, 3, at=OLD)
    legal_hold_place(
        portfolio=portfolio,
        property=held_site,
        record_kind="legacy_charge",
        placed_by=reviewer,
        reason="billing dispute",
    )

    sweep_trigger(slot=SLOT, now=NOW)
    cleanup_drain()

    with connection.cursor() as cursor:
        cursor.execute("SELECT site_ref, COUNT(*) FROM legacy_charges GROUP BY site_ref")
        left = dict(cursor.fetchall())
    assert left == {open_site.pk: 2, held_site.pk: 3}
    jobs = {job.property_id: job for job in CleanupJob.objects.filter(record_kind="legacy_charge")}
    assert (jobs[open_site.pk].rows_deleted, jobs[open_site.pk].batches) == (9, 3)
    assert (jobs[held_site.pk].rows_held, jobs[held_site.pk].outcome) == (3, JobOutcome.HELD)


# --- A monthly-partitioned table (PostgreSQL) -----------------------------------


def readings(building: Property, count: int, *, at: datetime) -> list[int]:
    rows = [
        MeterReading(customer_id=building.portfolio_id, building=building, read_at=at + timedelta(days=i))
        for i in range(count)
    ]
    return [row.pk for row in MeterReading.objects.bulk_create(rows)]


def partitions_holding(ids: list[int]) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT tableoid::regclass::text FROM meter_readings WHERE id = ANY(%s)", [ids])
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_partitioned_tables_keyset_index_counts_when_every_partition_has_it(shapes):
    assert check_kind("meter_reading", READING) == []
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX meter_readings_keyset")
        # On the parent only: the partitions have none.
        cursor.execute("CREATE INDEX meter_readings_keyset_only ON ONLY meter_readings (building_id, id)")
    (problem,) = check_kind("meter_reading", READING)
    assert problem.id == "retention.W008"


@pytest.mark.postgres
@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_monthly_partitioned_table_is_cleaned_by_row_deletes_pruned_to_the_partitions_before_the_cutoff(
    shapes, settings, portfolio, prop, active_policy, reviewer
):
    settings.CLEANUP_BATCH_SIZE = 25
    active_policy(portfolio, "meter_reading", 30)
    old = readings(prop, 100, at=utc("2026-03-01T00:00:00Z"))  # March to June
    young = readings(prop, 20, at=utc("2026-08-01T00:00:00Z"))
    assert len(partitions_holding(old)) == 4
    held = old[50]
    legal_hold_place(
        portfolio=portfolio,
        property=prop,
        record_kind="meter_reading",
        record_id=held,
        placed_by=reviewer,
        reason="a disputed meter reading",
    )
    # The batch's candidate scan, with the cutoff a batch would have: the
    # partitions wholly after it are pruned, the others walk their copy of the index.
    spec = get_spec("meter_reading")
    from cleanup_ops import sql

    statement = sql.partition_candidates(spec)
    params = {"property_id": prop.pk, "after_id": 0, "cutoff": utc("2026-07-22T02:00:00Z"), "lim": 25}
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + statement, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "meter_readings_2026_03" in plan and "meter_readings_2026_07" in plan
    assert "meter_readings_2026_08" not in plan and "meter_readings_2026_12" not in plan, plan
    assert "meter_readings_2026_03_building_id_id_read_at_idx" in plan, plan

    sweep_trigger(slot=SLOT, now=NOW)
    cleanup_drain()

    assert set(MeterReading.objects.values_list("pk", flat=True)) == {held, *young}
    job = CleanupJob.objects.get(record_kind="meter_reading")
    assert (job.rows_deleted, job.rows_held, job.batches) == (99, 1, 4)


# --- The guarantees on every shape ----------------------------------------------


def shape_records(kind: str, building: Property, count: int, *, at: datetime) -> None:
    if kind == "ticket":
        tickets(building, count, at=at)
    elif kind == "notice":
        notices(building.portfolio, count, at=at)
    elif kind == "visit":
        visits(Unit.objects.create(building=building), building.portfolio, count, at=at)
    elif kind == "legacy_charge":
        legacy_charges(building, count, at=at)
    else:
        readings(building, count, at=at)


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
@pytest.mark.parametrize(
    # The partitioned table is PostgreSQL's (on SQLite a plain one).
    "kind",
    [pytest.param(kind, marks=[pytest.mark.postgres] if kind == "meter_reading" else []) for kind in SHAPES],
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
