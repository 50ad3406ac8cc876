from __future__ import annotations

import json
import threading
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections, transaction
from django_q.models import OrmQ

from cleanup_ops.admission import sweep_admit
from cleanup_ops.models import CleanupJob, Sweep
from cleanup_ops.schedule import SlotError, slot_current, slot_parse, sweep_trigger
from properties.models import Portfolio, Property

from .conftest import make_records, utc

SLOT = utc("2026-08-21T02:00:00Z")
NOW = "2026-08-21T02:05:00Z"
OLD = utc("2020-01-01T00:00:00Z")
RECENT = utc("2026-08-01T00:00:00Z")


@pytest.fixture
def estate(portfolio, active_policy, row_deletes_only):
    """Three properties: two with expired leases, one with only recent ones.

    Tenant activity by row deletes only: admission does not depend on it (only
    ``cleanup_ops.table_partitions`` reads ``drop_table_partitions``), and each
    trigger here would otherwise drop some 140 empty table partitions first and
    make them again after the test (2 s a test). That the trigger drops them
    before admission is ``tests/test_table_partitions.py``'s."""
    active_policy(portfolio, "lease", 365)
    active_policy(portfolio, "tenant_activity", 30)
    props = [Property.objects.create(portfolio=portfolio, name=f"B{i}") for i in range(3)]
    make_records(props[0], "lease", 3, ended=OLD)
    make_records(props[1], "lease", 2, ended=OLD)
    make_records(props[2], "lease", 2, ended=RECENT)
    make_records(props[2], "tenant_activity", 1, ended=utc("2026-07-01T00:00:00Z"))
    return props


def run(*args: str) -> dict:
    out = StringIO()
    call_command("cleanup_sweep", *args, "--json", stdout=out)
    return json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.mark.django_db
class TestSlots:
    def test_the_current_slot_is_the_latest_scheduled_time_not_after_now(self):
        assert slot_current(now=utc("2026-08-21T02:00:00Z")) == SLOT
        assert slot_current(now=utc("2026-08-21T01:59:59Z")) == utc("2026-08-20T02:00:00Z")
        assert slot_current(now=utc("2026-08-21T13:00:00Z"), schedule="0 */6 * * *") == utc("2026-08-21T12:00:00Z")

    @pytest.mark.parametrize(
        "text", ["2026-08-21", "2026-08-21T02:00", "2026-08-21T02:00:30Z", "yesterday", "2026-02-30T02:00Z"]
    )
    def test_a_malformed_slot_is_refused_naming_the_flag(self, text):
        with pytest.raises(SlotError, match=r"^slot: "):
            slot_parse(text, now=utc(NOW))

    def test_a_future_slot_is_refused(self):
        with pytest.raises(SlotError, match="in the future"):
            slot_parse("2026-08-21T03:00Z", now=utc(NOW))

    @pytest.mark.parametrize("text", ["0001-01-02T00:00Z", "0001-01-01T00:00Z", "1969-12-31T23:59Z"])
    def test_an_ancient_slot_is_refused_before_any_arithmetic(self, text):
        with pytest.raises(SlotError, match=rf"^slot: '{text}' is before the earliest slot 1970-01-01T00:00Z"):
            slot_parse(text, now=utc(NOW))
        with pytest.raises(SlotError, match="before the earliest slot"):
            sweep_trigger(slot=utc(text.replace("Z", ":00Z")), now=utc(NOW))
        assert not Sweep.objects.exists()


@pytest.fixture
def clock(time_machine):
    time_machine.move_to(NOW, tick=False)
    return time_machine


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
class TestAdmission:
    def test_one_job_per_partition_with_rows_past_the_cutoff(self, estate, portfolio):
        result = run("--slot", "2026-08-21T02:00Z")
        assert result["created"] is True and result["key"] == "cleanup:2026-08-21T02:00Z"
        jobs = {j.key: j for j in CleanupJob.objects.all()}
        assert set(jobs) == {
            f"cleanup:2026-08-21T02:00Z:{portfolio.pk}:{estate[0].pk}:lease",
            f"cleanup:2026-08-21T02:00Z:{portfolio.pk}:{estate[1].pk}:lease",
            f"cleanup:2026-08-21T02:00Z:{portfolio.pk}:{estate[2].pk}:tenant_activity",
        }
        lease_job = jobs[f"cleanup:2026-08-21T02:00Z:{portfolio.pk}:{estate[0].pk}:lease"]
        assert lease_job.cutoff == utc("2025-08-21T02:00:00Z")
        assert lease_job.policy_version.retention_days == 365
        assert result["jobs_admitted"] == 3
        assert Sweep.objects.get().status == Sweep.Status.RUNNING

    def test_the_same_slot_twice_gives_one_sweep_and_the_second_reports_it(self, estate):
        first = run("--slot", "2026-08-21T02:00Z")
        second = run("--slot", "2026-08-21T02:00Z")
        assert second["created"] is False and second["sweep_id"] == first["sweep_id"]
        assert Sweep.objects.count() == 1
        assert CleanupJob.objects.count() == 3

    def test_a_crashed_admission_is_completed_without_duplicates(self, estate):
        sweep = Sweep.objects.create(key="cleanup:2026-08-21T02:00Z", slot=SLOT)
        # Half-done admission: one job exists, the sweep is still admitting.
        from cleanup_ops.admission import partitions_due

        part = partitions_due(slot=SLOT)[0]
        CleanupJob.objects.create(
            sweep=sweep,
            key=f"{sweep.key}:{part.portfolio_id}:{part.property_id}:{part.record_kind}",
            portfolio_id=part.portfolio_id,
            property_id=part.property_id,
            record_kind=part.record_kind,
            policy_version=part.version,
            cutoff=part.cutoff,
            available_at=SLOT,
        )
        result = run("--slot", "2026-08-21T02:00Z")
        assert result["created"] is False
        assert result["jobs_admitted"] == 3
        assert CleanupJob.objects.count() == 3
        assert sweep_admit(sweep_id=sweep.pk) == 0  # running now: admission does nothing more

    def test_a_sweep_a_crash_left_admitting_is_completed_by_the_trigger_of_another_slot(self, estate, clock):
        # The crash: the sweep row committed, its admission never ran.
        stranded = Sweep.objects.create(key="cleanup:2026-08-20T02:00Z", slot=utc("2026-08-20T02:00:00Z"))
        result = run("--slot", "2026-08-21T02:00Z")
        stranded.refresh_from_db()
        assert (stranded.status, stranded.jobs_admitted) == (Sweep.Status.RUNNING, 3)
        assert CleanupJob.objects.filter(sweep=stranded).count() == 3
        # The newer sweep finds those partitions open and carries them over.
        assert (result["created"], result["jobs_admitted"], result["carried_over"]) == (True, 0, 3)
        assert CleanupJob.objects.count() == 3

    def test_the_dispatchers_tick_completes_a_stranded_admission_and_drains_a_finished_sweep(self, estate, clock):
        from cleanup_ops import tasks
        from retention.models import PolicyVersion

        version = PolicyVersion.objects.filter(status="approved").first()

        def sweep_with_one_job(slot: str, *, state: str) -> Sweep:
            sweep = Sweep.objects.create(key=f"cleanup:{slot}", slot=utc(slot), status=Sweep.Status.RUNNING)
            CleanupJob.objects.create(
                sweep=sweep,
                key=f"{sweep.key}:job",
                portfolio_id=estate[0].portfolio_id,
                property_id=estate[0].pk,
                record_kind="tenant_activity",
                policy_version=version,
                cutoff=OLD,
                available_at=utc(NOW),
                state=state,
                outcome="nothing_eligible" if state == "done" else "",
            )
            return sweep

        # Its last job's outcome was recorded, the sweep's status was not (a
        # crash or a database error right after the job finished).
        finished = sweep_with_one_job("2026-08-18T02:00Z", state="done")
        busy = sweep_with_one_job("2026-08-19T02:00Z", state="pending")
        stranded = Sweep.objects.create(key="cleanup:2026-08-21T02:00Z", slot=SLOT)  # admission never ran

        tasks.dispatch()

        statuses = dict(Sweep.objects.values_list("pk", "status"))
        assert statuses[finished.pk] == Sweep.Status.DRAINED
        assert Sweep.objects.get(pk=finished.pk).finished_at is not None
        assert statuses[busy.pk] == Sweep.Status.RUNNING  # an open job: not finished
        assert statuses[stranded.pk] == Sweep.Status.RUNNING  # admitted: its jobs are waiting
        assert CleanupJob.objects.filter(sweep=stranded).count() == 3

    def test_a_partition_with_an_open_job_from_an_earlier_sweep_is_carried_over(self, estate, clock):
        clock.move_to("2026-08-20T02:05:00Z", tick=False)
        run("--slot", "2026-08-20T02:00Z")
        clock.move_to(NOW, tick=False)
        earlier = CleanupJob.objects.order_by("id")
        earlier.filter(pk=earlier[0].pk).update(state=CleanupJob.State.DONE)
        result = run("--slot", "2026-08-21T02:00Z")
        assert result["carried_over"] == 2
        assert result["jobs_admitted"] == 1
        assert CleanupJob.objects.count() == 4

    def test_an_open_purge_job_does_not_carry_its_partition_over(self, estate, clock):
        clock.move_to("2026-08-20T02:05:00Z", tick=False)
        run("--slot", "2026-08-20T02:00Z")
        earlier = CleanupJob.objects.order_by("id")
        CleanupJob.objects.filter(pk__in=[j.pk for j in earlier]).update(state=CleanupJob.State.DONE)
        first = earlier.first()
        CleanupJob.objects.create(
            sweep=first.sweep,
            key="purge:waiting-on-retry-after",
            job_kind="purge",
            portfolio_id=first.portfolio_id,
            property_id=first.property_id,
            record_kind=first.record_kind,
            policy_version=first.policy_version,
            cutoff=first.cutoff,
            available_at=first.available_at,
        )
        clock.move_to(NOW, tick=False)
        result = run("--slot", "2026-08-21T02:00Z")
        assert (result["carried_over"], result["jobs_admitted"]) == (0, 3)

    def test_a_withdrawn_policy_admits_nothing(self, portfolio, prop, active_policy):
        active_policy(portfolio, "lease", 365)
        make_records(prop, "lease", 2, ended=OLD)
        active_policy(portfolio, "lease", 365, enabled=False)
        assert run("--slot", "2026-08-21T02:00Z")["jobs_admitted"] == 0
        assert Sweep.objects.get().status == Sweep.Status.DRAINED

    def test_messages_reach_the_broker_only_after_the_admitting_transaction_commits(
        self, estate, settings, django_capture_on_commit_callbacks
    ):
        settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": False}
        settings.CLEANUP_PORTFOLIO_MAX_LEASES = 10

        class Abort(Exception):
            pass

        with pytest.raises(Abort), transaction.atomic():
            sweep_trigger(slot=SLOT)
            assert OrmQ.objects.count() == 0  # admitted, but not yet committed: nothing sent
            raise Abort
        assert OrmQ.objects.count() == 0 and not Sweep.objects.exists()
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            sweep_trigger(slot=SLOT)
            assert OrmQ.objects.count() == 0
        assert callbacks  # the dispatcher ran only as an on-commit callback
        assert OrmQ.objects.count() == 3

    def test_dry_run_reports_eligible_and_held_counts_and_writes_nothing(self, estate, portfolio, reviewer):
        from retention.services import legal_hold_place

        legal_hold_place(portfolio=portfolio, property=estate[1], placed_by=reviewer, reason="dispute for the tests")
        result = run("--slot", "2026-08-21T02:00Z", "--dry-run")
        rows = {r["record_kind"]: r for r in result["partitions"]}
        assert (rows["lease"]["eligible"], rows["lease"]["held"]) == (3, 2)
        assert (rows["tenant_activity"]["eligible"], rows["tenant_activity"]["held"]) == (1, 0)
        assert not Sweep.objects.exists() and not CleanupJob.objects.exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
@pytest.mark.parametrize("enabled", [True, False], ids=["enabled", "disabled"])
@pytest.mark.parametrize("path", ["admission", "dry_run"])
def test_admission_and_the_dry_run_send_no_statement_over_a_kinds_table_when_no_portfolio_has_a_version_in_force(
    portfolio, active_policy, row_deletes_only, enabled, path
):
    """Only the kinds some portfolio has an approved, enabled version of are asked
    for due partitions: each statement is planned over every table partition of
    its table. A disabled version is no version in force: nothing of it is admitted,
    or reported due."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from cleanup_ops.admission import partitions_due
    from retention.registry import REGISTRY

    active_policy(portfolio, "lease", 365, enabled=enabled)
    prop = Property.objects.create(portfolio=portfolio, name="B0")
    make_records(prop, "lease", 2, ended=OLD)
    make_records(prop, "tenant_activity", 2, ended=OLD)
    sweep = Sweep.objects.create(key="cleanup:2026-08-21T02:00Z", slot=SLOT)

    with CaptureQueriesContext(connection) as queries:
        if path == "admission":
            sweep_admit(sweep_id=sweep.pk)
            found = set(CleanupJob.objects.values_list("record_kind", flat=True))
        else:
            found = {partition.record_kind for partition in partitions_due(slot=SLOT)}

    asked = {kind for kind, spec in REGISTRY.items() for q in queries.captured_queries if f'"{spec.table}"' in q["sql"]}
    assert asked == ({"lease"} if enabled else set())
    assert found == ({"lease"} if enabled else set())


@pytest.mark.django_db
@pytest.mark.usefixtures("clock")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slot", "21/08/2026"], "--slot: expected a UTC minute"),
        (["--slot", "2026-08-21T09:00Z"], "--slot: '2026-08-21T09:00Z' is in the future"),
        (["--slot", "0001-01-02T00:00Z"], "--slot: '0001-01-02T00:00Z' is before the earliest slot"),
        (["--dry-run", "--portfolio", "999999"], "--portfolio: no portfolio with id 999999"),
        (["--portfolio", "1"], "--portfolio only narrows a --dry-run"),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(estate, args, message):
    with pytest.raises(CommandError, match=message):
        call_command("cleanup_sweep", *args, stdout=StringIO())
    assert not Sweep.objects.exists() and not CleanupJob.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_triggers_of_one_slot_make_one_sweep_and_one_job_per_partition(manager, reviewer):
    portfolio = Portfolio.objects.create(name="P", slug="p")
    from retention.services import policy_version_approve, policy_version_submit, retention_policy_get_or_create

    policy = retention_policy_get_or_create(portfolio=portfolio, record_kind="lease")
    version = policy_version_submit(policy=policy, retention_days=365, author=manager, reason="r for the tests")
    policy_version_approve(version_id=version.pk, reviewer=reviewer, note="approved for the tests")
    props = [Property.objects.create(portfolio=portfolio, name=f"B{i}") for i in range(12)]
    for p in props:
        make_records(p, "lease", 2, ended=OLD)

    barrier = threading.Barrier(20)
    results: list[dict] = []
    errors: list[BaseException] = []

    def trigger() -> None:
        try:
            barrier.wait()
            results.append(sweep_trigger(slot=SLOT, now=utc(NOW)).as_dict())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=trigger) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert Sweep.objects.count() == 1
    assert sum(1 for r in results if r["created"]) == 1
    assert {r["sweep_id"] for r in results} == {Sweep.objects.get().pk}
    assert CleanupJob.objects.count() == 12
    assert all(r["jobs_admitted"] == 12 for r in results)
