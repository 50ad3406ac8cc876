"""The scaled-to-zero fleet: the definition of due work (and KEDA's copy of it
in SQL), ``cleanup_health --due``, and a drain that waits for work and exits
once nothing has been due for the idle time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connection

from chaos.units import seconds, unit_read
from cleanup_ops import fleet
from cleanup_ops.execution.leases import job_lease
from cleanup_ops.fleet import drain_until_idle, due_work_count
from cleanup_ops.models import CleanupJob, JobKind, JobState, Sweep
from cleanup_ops.recovery.classification import DEAD, Classification, FailureCategory
from cleanup_ops.recovery.failures import job_fail
from cleanup_ops.recovery.operator import dead_letter_redrive, pipeline_pause
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property

from .conftest import make_lease_estate, make_records, utc
from .test_settings import start

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "docs" / "deploy"
OLD = utc("2020-01-01T00:00:00Z")


def keda_queries() -> dict[str, str]:
    """Each ScaledObject's query in the shipped manifest, by the Deployment it scales."""
    docs = list(yaml.safe_load_all((DEPLOY / "keda-scaledobject.yaml").read_text()))
    return {
        doc["spec"]["scaleTargetRef"]["name"]: doc["spec"]["triggers"][0]["metadata"]["query"]
        for doc in docs
        if doc["kind"] == "ScaledObject"
    }


def run_query(query: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(query)
        return int(cursor.fetchone()[0])


def other_backends(application_name: str | None = None) -> int:
    """Other sessions on this test database (of one application name: a child
    process started with ``PGAPPNAME``) — a child process that has connected."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND (%s::text IS NULL OR application_name = %s)",
            [application_name, application_name],
        )
        return int(cursor.fetchone()[0])


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


@pytest.fixture
def jobs_of_every_state(portfolio, active_policy):  # type: ignore[no-untyped-def]
    """Jobs around the database's own clock (KEDA's query uses ``now()``),
    hours away from it so the ORM's clock and PostgreSQL's agree."""
    version = active_policy(portfolio, "lease", 365)
    paused = Portfolio.objects.create(name="Paused Lettings", slug="paused")
    now = db_now()
    hour = timedelta(hours=1)
    sweep = Sweep.objects.create(key="cleanup:2026-08-21T02:00Z", slot=utc("2026-08-21T02:00:00Z"))
    token = uuid.uuid4()

    def job(name: str, *, job_kind: str = JobKind.DELETE, portfolio_id: int | None = None, **fields: object) -> None:
        fields.setdefault("available_at", now - hour)
        CleanupJob.objects.create(
            sweep=sweep,
            key=f"{sweep.key}:{name}",
            job_kind=job_kind,
            portfolio_id=portfolio_id or portfolio.pk,
            property_id=abs(hash(name)) % 10_000,
            record_kind="lease",
            policy_version=version,
            cutoff=now - timedelta(days=365),
            **fields,
        )

    leased = {"state": JobState.LEASED, "lease_token": token, "lease_owner": "h:1"}
    # Wanting a worker (delete): 4.
    job("due")
    job("due-2")
    job("expired-lease", **leased, lease_expires_at=now - hour)
    job("live-lease", **leased, lease_expires_at=now + hour)
    # Not wanting one.
    job("retry-later", available_at=now + hour)
    job("expired-lease-not-yet-available", **leased, available_at=now + hour, lease_expires_at=now - hour)
    job("done", state=JobState.DONE, outcome="deleted")
    job("dead", state=JobState.DEAD)
    job("paused-portfolio", portfolio_id=paused.pk)
    # Purge jobs: 1 wanting a worker.
    job("purge-due", job_kind=JobKind.PURGE)
    job("purge-later", job_kind=JobKind.PURGE, available_at=now + hour)
    pipeline_pause(actor=None, reason="portfolio under migration", portfolio_id=paused.pk)
    return now


@pytest.mark.django_db
def test_kedas_query_counts_exactly_the_jobs_the_orm_calls_due_work(jobs_of_every_state):
    now = jobs_of_every_state
    queries = keda_queries()
    assert set(queries) == {"retention-qcluster", "retention-qcluster-purge"}
    for deployment, kind, expected in (("retention-qcluster", "delete", 4), ("retention-qcluster-purge", "purge", 1)):
        orm = CleanupJob.objects.due_work(now=now).filter(job_kind=kind).count()
        assert run_query(queries[deployment]) == orm == expected, deployment


@pytest.mark.django_db
def test_under_a_global_pause_kedas_query_and_the_orm_both_see_no_due_work(jobs_of_every_state):
    pipeline_pause(actor=None, reason="database maintenance tonight")
    for query in keda_queries().values():
        assert run_query(query) == 0
    assert due_work_count(now=jobs_of_every_state) == 0


def test_the_keda_cooldown_is_the_idle_time_and_the_timer_runs_the_products_commands(settings):
    for doc in yaml.safe_load_all((DEPLOY / "keda-scaledobject.yaml").read_text()):
        if doc["kind"] == "ScaledObject":
            assert doc["spec"]["minReplicaCount"] == 0
            assert doc["spec"]["cooldownPeriod"] == settings.CLEANUP_IDLE_EXIT_SECONDS
    service = unit_read(DEPLOY / "retention-drain.service")["Service"]
    assert service["ExecCondition"][0].endswith("manage.py cleanup_health --due")
    assert "manage.py cleanup_drain --until-idle" in service["ExecStart"][0]
    timer = unit_read(DEPLOY / "retention-drain.timer")["Timer"]
    assert seconds(timer["OnUnitInactiveSec"][0]) == 30


# --- cleanup_health --due ---------------------------------------------------------


def health_due(*args: str) -> tuple[int, dict]:
    out = StringIO()
    try:
        call_command("cleanup_health", "--due", "--json", *args, stdout=out)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, json.loads(out.getvalue())


@pytest.mark.django_db
def test_cleanup_health_due_exits_1_while_nothing_is_due_and_0_once_a_sweep_admits_work(prop, active_policy):
    active_policy(prop.portfolio, "lease", 365)
    assert health_due() == (1, {"due": False, "jobs": 0, "jobs_by_kind": {"delete": 0, "purge": 0}})
    make_records(prop, "lease", 3, ended=OLD)
    sweep_trigger()
    assert health_due() == (0, {"due": True, "jobs": 1, "jobs_by_kind": {"delete": 1, "purge": 0}})


@pytest.mark.django_db
def test_cleanup_health_due_ignores_work_in_a_paused_portfolio(prop, active_policy):
    active_policy(prop.portfolio, "lease", 365)
    make_records(prop, "lease", 3, ended=OLD)
    sweep_trigger()
    pipeline_pause(actor=None, reason="customer asked us to wait", portfolio_id=prop.portfolio_id)
    assert health_due()[0] == 1


@pytest.mark.django_db
def test_cleanup_health_due_exits_255_when_the_database_cannot_tell(monkeypatch):
    def unreachable(**kwargs: object) -> dict[str, int]:
        raise OperationalError("connection refused")

    monkeypatch.setattr("cleanup_ops.management.commands.cleanup_health.due_work_by_kind", unreachable)
    code, report = health_due()
    assert code == 255
    assert report["due"] is None and "OperationalError" in report["detail"]


@pytest.mark.django_db
def test_cleanup_health_due_is_given_alone():
    with pytest.raises(CommandError, match="--due is given alone"):
        call_command("cleanup_health", "--due", "--liveness")


# --- cleanup_drain --until-idle -----------------------------------------------------


class FakeClock:
    """A monotonic clock that ``sleep`` advances, moving the wall clock
    (time_machine) with it, and that runs ``events`` once their time comes."""

    def __init__(self, traveller, events: dict[float, Callable[[], None]] | None = None) -> None:  # type: ignore[no-untyped-def]
        self.t = 0.0
        self.traveller = traveller
        self.events = dict(events or {})

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        self.traveller.shift(timedelta(seconds=seconds))
        for at in sorted(self.events):
            if at <= self.t:
                self.events.pop(at)()


@pytest.fixture
def clock(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(utc("2026-03-10T03:00:00Z"), tick=False)
    return time_machine


@pytest.fixture
def two_partitions(clock, portfolio, active_policy) -> list[Property]:  # type: ignore[no-untyped-def]
    active_policy(portfolio, "lease", 365)
    props = [Property.objects.create(portfolio=portfolio, name=f"B{i}") for i in range(2)]
    for p in props:
        make_records(p, "lease", 3, ended=OLD)
    return props


def open_jobs() -> int:
    return CleanupJob.objects.open().count()


@pytest.mark.django_db
def test_the_drain_exits_once_nothing_has_been_due_for_the_idle_time(two_partitions, clock):
    sweep_trigger()
    fake = FakeClock(clock)
    result = drain_until_idle(idle_seconds=30, poll=1, clock=fake, sleep=fake.sleep)
    assert open_jobs() == 0
    assert result.exit_reason == "idle"
    assert result.rows_deleted == 6
    assert fake.t == 30


def make_retry(clock) -> Callable[[], None]:  # type: ignore[no-untyped-def]
    """One of the sweep's jobs failed before the drain started: due again in 10 s."""
    job = CleanupJob.objects.order_by("id").first()
    CleanupJob.objects.filter(pk=job.pk).update(
        attempt=1, available_at=job.available_at + timedelta(seconds=10), last_error_category="timeout"
    )
    return lambda: None


def make_redrive(clock) -> Callable[[], None]:  # type: ignore[no-untyped-def]
    """A dead letter an operator redrives 10 s into the drain's idle time."""
    job = CleanupJob.objects.order_by("id").first()
    lease = job_lease(job_id=job.pk, owner="test:1")
    job_fail(lease=lease, classification=Classification(FailureCategory.POLICY_OR_INPUT, DEAD, "InvalidInput"))
    letter_id = CleanupJob.objects.get(pk=job.pk).dead_letter.pk
    return lambda: dead_letter_redrive(letter_id=letter_id, actor=None, reason="the input was fixed by hand")


def make_sweep(clock) -> Callable[[], None]:  # type: ignore[no-untyped-def]
    """Yesterday's sweep drains one partition; 10 s into the idle time
    today's sweep admits the other."""
    CleanupJob.objects.filter(pk=CleanupJob.objects.order_by("-id").values("id")[:1]).delete()
    return lambda: sweep_trigger(slot=utc("2026-03-10T02:00:00Z"))


@pytest.mark.django_db
@pytest.mark.parametrize("becomes_due", [make_sweep, make_retry, make_redrive], ids=["sweep", "retry", "redrive"])
def test_work_that_becomes_due_while_the_drain_waits_is_taken_and_restarts_the_idle_time(
    two_partitions, clock, becomes_due
):
    sweep_trigger(slot=utc("2026-03-09T02:00:00Z"))
    event = becomes_due(clock)
    fake = FakeClock(clock, {10.0: event})
    result = drain_until_idle(idle_seconds=30, poll=1, clock=fake, sleep=fake.sleep)
    assert open_jobs() == 0
    assert result.rows_deleted == 6
    assert result.exit_reason == "idle"
    assert fake.t == 10 + 30  # the idle time started again after the late work


@pytest.mark.django_db
def test_a_paused_portfolios_due_work_does_not_keep_the_drain_up(two_partitions, clock, portfolio):
    sweep_trigger()
    pipeline_pause(actor=None, reason="customer asked us to wait", portfolio_id=portfolio.pk)
    fake = FakeClock(clock)
    result = drain_until_idle(idle_seconds=30, poll=1, clock=fake, sleep=fake.sleep)
    assert result.rows_deleted == 0 and result.exit_reason == "idle"
    assert open_jobs() == 2


@pytest.mark.django_db
def test_drain_flags_are_checked():
    with pytest.raises(CommandError, match="--idle-seconds"):
        call_command("cleanup_drain", "--idle-seconds", "5")
    with pytest.raises(CommandError, match="--idle-seconds"):
        call_command("cleanup_drain", "--until-idle", "--idle-seconds", "0.5")
    with pytest.raises(CommandError, match="give one"):
        call_command("cleanup_drain", "--until-idle", "--max-seconds", "5")


@pytest.mark.parametrize("value", ["0", "soon", "-5"])
def test_a_bad_idle_time_stops_start_up_naming_the_variable(value):
    result = start({"CLEANUP_IDLE_EXIT_SECONDS": value})
    assert result.returncode != 0
    assert "CLEANUP_IDLE_EXIT_SECONDS:" in result.stderr


@pytest.mark.django_db(transaction=True)
def test_a_real_drain_process_works_the_sweep_and_exits_after_the_idle_time():
    make_lease_estate(rows=10)
    sweep_trigger()
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CLEANUP_IDLE_EXIT_SECONDS": "2",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "cleanup_drain", "--until-idle", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["exit_reason"] == "idle"
    assert summary["idle_seconds"] >= 2
    assert open_jobs() == 0
    assert fleet.due_work_count() == 0


@pytest.mark.django_db(transaction=True)
def test_sigterm_stops_a_waiting_drain_at_once_and_it_exits_0():
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CLEANUP_IDLE_EXIT_SECONDS": "600",
        # Its sessions, told from any other on the database (a connection an
        # earlier test's thread or process has not closed yet would otherwise
        # pass for the child's, and the SIGTERM would come before its handler).
        "PGAPPNAME": "sigterm-drain",
    }
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "cleanup_drain", "--until-idle", "--json"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Waiting for work once it has asked the database (its SIGTERM handler is in place by then).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not other_backends("sigterm-drain"):
            time.sleep(0.1)
        assert proc.poll() is None and other_backends("sigterm-drain")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["exit_reason"] == "stopped"


# Transactional: the drain drops the connection after the error, which a
# test's enclosing transaction would not survive (production runs in autocommit).
@pytest.mark.django_db(transaction=True)
def test_a_database_error_while_waiting_is_survived_and_the_work_after_it_is_drained(
    two_partitions, clock, monkeypatch
):
    sweep_trigger()
    real = fleet.due_work_count
    failures = iter([True])

    def flaky(**kwargs: object) -> int:
        if next(failures, False):
            raise OperationalError("server closed the connection unexpectedly")
        return real(**kwargs)

    monkeypatch.setattr(fleet, "due_work_count", flaky)
    fake = FakeClock(clock)
    result = drain_until_idle(idle_seconds=30, poll=1, clock=fake, sleep=fake.sleep)
    assert result.rows_deleted == 6 and result.exit_reason == "idle"
    assert open_jobs() == 0
