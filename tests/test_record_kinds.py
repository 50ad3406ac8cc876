"""Record kinds from RETENTION_RECORD_KINDS: a kind of other names and shapes
(tests/schema_b) runs the same pipeline, and a wrong configuration is refused
at start-up by a system check naming the setting, the kind and the field."""

from __future__ import annotations

from datetime import date, timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from cleanup_ops.execution.runner import cleanup_drain
from cleanup_ops.models import CleanupJob, DocumentDisposition, JobOutcome, LedgerEntry, PurgeRequest
from cleanup_ops.schedule import sweep_trigger
from properties.models import Property
from retention.checks import check_kind, record_kinds_check
from retention.registry import DEFAULT_RECORD_KINDS, REGISTRY, get_spec, registry_reload
from retention.services import legal_hold_place
from tests.schema_b.models import WorkOrder

from .conftest import utc

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
WORK_ORDER = {
    "model": "schema_b.WorkOrder",
    "label": "Work order",
    "timestamp": "closed_on",
    "portfolio": "customer",
    "property": "building",
    "attachment": {"field": "contract_ref"},
}


@pytest.fixture
def work_orders(settings):  # type: ignore[no-untyped-def]
    """The demo's kinds and a work-order kind of schema_b, for one test."""
    settings.RETENTION_RECORD_KINDS = {**DEFAULT_RECORD_KINDS, "work_order": WORK_ORDER}
    registry_reload()
    yield get_spec("work_order")
    del settings.RETENTION_RECORD_KINDS
    registry_reload()


@pytest.fixture
def clock(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    return time_machine


def work_order(building: Property, closed_on: date, contract: str | None = None) -> int:
    return WorkOrder.objects.create(
        customer_id=building.portfolio_id, building=building, closed_on=closed_on, contract_ref=contract
    ).number


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
def test_a_kind_of_other_names_keeps_the_cutoffs_own_day_and_holds_and_purges_its_contracts(
    work_orders, portfolio, prop, active_policy, reviewer, docstore
):
    active_policy(portfolio, "work_order", 30)
    # Cutoff: 2026-07-22T02:00Z. A DateField day is eligible only when all of it lies before.
    cutoff_day = date(2026, 7, 22)
    kept_same_day = work_order(prop, cutoff_day)
    work_order(prop, cutoff_day - timedelta(days=1), contract="contract-1")  # deleted
    held = work_order(prop, date(2026, 7, 1), contract="contract-2")
    young = work_order(prop, date(2026, 8, 10))
    docstore.create("contract-1", "contract-2")
    legal_hold_place(
        portfolio=portfolio,
        property=prop,
        record_kind="work_order",
        record_id=held,
        placed_by=reviewer,
        reason="a claim over this order",
    )

    sweep_trigger(slot=SLOT, now=NOW)
    cleanup_drain()

    assert set(WorkOrder.objects.values_list("number", flat=True)) == {kept_same_day, held, young}
    job = CleanupJob.objects.get(record_kind="work_order", job_kind="delete")
    assert (job.outcome, job.rows_deleted, job.rows_held) == (JobOutcome.DELETED, 1, 1)
    (entry,) = LedgerEntry.objects.filter(record_kind="work_order")
    assert (entry.candidates, entry.rows_deleted, entry.rows_held) == (2, 1, 1)
    assert docstore.documents() == {"contract-2"}
    assert PurgeRequest.objects.get().documents_purged == 1
    assert DocumentDisposition.objects.get(document_id="contract-1").state == "purged"


@pytest.mark.django_db
def test_the_preview_counts_a_date_kind_by_whole_days(work_orders, portfolio, prop):
    from retention.eligibility import count_expired_and_held

    work_order(prop, date(2026, 7, 21))
    work_order(prop, date(2026, 7, 22))
    assert count_expired_and_held("work_order", cutoff=utc("2026-07-22T02:00:00Z"), property_id=prop.pk) == (1, 0)


@pytest.mark.django_db
def test_adding_a_kind_in_the_settings_writes_no_migration(work_orders):
    out = StringIO()
    call_command("makemigrations", "retention", "cleanup_ops", check=True, dry_run=True, stdout=out)
    assert "No changes detected" in out.getvalue()
    assert "work_order" in REGISTRY


def codes(kind: str, entry: object) -> list[str]:
    return [message.id for message in check_kind(kind, entry)]


def messages(kind: str, entry: object) -> str:
    return " | ".join(message.msg for message in check_kind(kind, entry))


def test_the_default_kinds_and_a_well_formed_kind_pass_the_checks(settings):
    settings.RETENTION_RECORD_KINDS = {**DEFAULT_RECORD_KINDS, "work_order": WORK_ORDER}
    assert record_kinds_check() == []


@pytest.mark.parametrize(
    ("change", "code", "names"),
    [
        ({"model": "schema_b.NoSuchModel"}, "retention.E002", "['model']"),
        ({"model": "not a label"}, "retention.E002", "['model']"),
        ({"timestamp": "contract_ref"}, "retention.E003", "['timestamp']"),
        ({"timestamp": "opened_on"}, "retention.E003", "['timestamp']"),
        ({"portfolio": "building"}, "retention.E004", "['portfolio']"),
        ({"portfolio": "closed_on"}, "retention.E004", "['portfolio']"),
        ({"property": "customer"}, "retention.E004", "['property']"),
        ({"property": "unit__building"}, "retention.E005", "['property']"),
        ({"property": "building__portfolio__name"}, "retention.E005", "['property']"),
        ({"attachment": {"field": "closed_on"}}, "retention.E007", "['attachment']"),
        ({"attachment": {"field": "contract_ref", "storage": "s3"}}, "retention.E007", "['attachment']"),
        ({"attachment": "contract_ref"}, "retention.E007", "['attachment']"),
        ({"colour": "blue"}, "retention.E001", "['colour']"),
    ],
)
def test_a_wrong_kind_is_refused_naming_the_setting_the_kind_and_the_field(change, code, names):
    entry = {**WORK_ORDER, **change}
    assert code in codes("work_order", entry)
    text = messages("work_order", entry)
    assert f"RETENTION_RECORD_KINDS['work_order']{names}" in text


def test_a_kind_without_its_keyset_index_is_refused_with_the_index_to_add():
    entry = {"model": "schema_b.Inspection", "timestamp": "done_at", "portfolio": "customer", "property": "building"}
    (problem,) = check_kind("inspection", entry)
    assert problem.id == "retention.E008"
    assert "models.Index(fields=['building', 'id'], include=['done_at']" in problem.hint


def test_a_kind_name_and_the_setting_itself_are_checked(settings):
    assert codes("Work Order", WORK_ORDER) == ["retention.E001"]
    settings.RETENTION_RECORD_KINDS = ["lease"]
    assert [m.id for m in record_kinds_check()] == ["retention.E001"]


def test_a_wrong_kind_stops_manage_py_check(settings):
    from django.core.management.base import SystemCheckError

    settings.RETENTION_RECORD_KINDS = {"work_order": {**WORK_ORDER, "timestamp": "contract_ref"}}
    with pytest.raises(SystemCheckError, match=r"RETENTION_RECORD_KINDS\['work_order'\]\['timestamp'\]"):
        call_command("check")
