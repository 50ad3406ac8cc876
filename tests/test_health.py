"""Worker heartbeats and ``cleanup_health`` (liveness, readiness) against the real database."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.test.utils import CaptureQueriesContext

from cleanup_ops import health
from cleanup_ops.health import (
    cluster_identity,
    cluster_liveness,
    heartbeat_on_spawn,
    heartbeat_on_task_start,
    heartbeat_record_turn,
)
from cleanup_ops.models import CleanupJob, WorkerHeartbeat
from cleanup_ops.recovery.operator import pipeline_pause
from cleanup_ops.schedule import sweep_trigger

from .conftest import make_records, utc

pytestmark = pytest.mark.django_db

NOW = utc("2026-03-10T03:00:00Z")
OLD = utc("2020-01-01T00:00:00Z")


@pytest.fixture
def clock(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    return time_machine


@pytest.fixture(autouse=True)
def _fresh_heartbeat_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test is a fresh worker process of sentinel 4242 that has written nothing yet."""
    monkeypatch.setattr(health, "_unwritten", health._Unwritten())
    monkeypatch.setattr(health.os, "getppid", lambda: 4242)
    # The flush timer would write from another thread; tests call heartbeat_flush themselves.
    flushes: list[float] = []
    monkeypatch.setattr(health, "_flush_later", flushes.append)
    monkeypatch.setattr(health, "_flush_timer", None)


@pytest.fixture
def due_work(clock, portfolio, prop, active_policy):  # type: ignore[no-untyped-def]
    """A sweep admitted at NOW: one due job the cluster could take."""
    active_policy(portfolio, "lease", 365)
    make_records(prop, "lease", 5, ended=OLD)
    sweep_trigger()
    assert CleanupJob.objects.due(now=NOW).count() == 1
    return portfolio


def liveness(*args: str) -> tuple[int, dict]:
    out = StringIO()
    try:
        call_command("cleanup_health", "--liveness", "--json", *args, stdout=out)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    report = json.loads(out.getvalue())
    return code, report["checks"][0]


def test_a_finished_turn_writes_the_heartbeat_with_host_cluster_pid_and_counts(clock):
    assert heartbeat_record_turn(jobs_leased=3, rows_deleted=120)
    row = WorkerHeartbeat.objects.get()
    assert (row.host, row.cluster) == cluster_identity()
    assert row.pid == 4242
    assert (row.started_at, row.last_progress_at) == (NOW, NOW)
    assert (row.turns, row.jobs_leased, row.rows_deleted) == (1, 3, 120)


def test_heartbeats_are_one_statement_at_most_once_per_interval_and_carry_the_throttled_counts(
    clock, monkeypatch, settings
):
    settings.CLEANUP_HEARTBEAT_SECONDS = 5
    monotonic = [1000.0]
    monkeypatch.setattr(health.time, "monotonic", lambda: monotonic[0])
    with CaptureQueriesContext(connection) as queries:
        assert heartbeat_record_turn(jobs_leased=1, rows_deleted=10)
        monotonic[0] += 2
        clock.shift(2)
        assert not heartbeat_record_turn(jobs_leased=2, rows_deleted=20)
        assert not heartbeat_record_turn(jobs_leased=4, rows_deleted=40)
    assert len(queries) == 1
    row = WorkerHeartbeat.objects.get()
    assert (row.turns, row.jobs_leased, row.rows_deleted, row.last_progress_at) == (1, 1, 10, NOW)

    monotonic[0] += 5
    clock.shift(5)
    assert heartbeat_record_turn(jobs_leased=8, rows_deleted=80)
    row.refresh_from_db()
    assert (row.turns, row.jobs_leased, row.rows_deleted) == (4, 15, 150)
    assert row.last_progress_at == NOW + timedelta(seconds=7)


def test_a_heartbeat_that_cannot_be_written_is_carried_into_the_next_and_never_raises(clock, monkeypatch):
    def database_down(**kwargs: object) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    real_write = health._write
    monkeypatch.setattr(health, "_write", database_down)
    assert not heartbeat_record_turn(jobs_leased=2, rows_deleted=5)
    monkeypatch.setattr(health, "_write", real_write)
    assert heartbeat_record_turn(jobs_leased=1, rows_deleted=1)
    row = WorkerHeartbeat.objects.get()
    assert (row.turns, row.jobs_leased, row.rows_deleted) == (2, 3, 6)


def test_a_new_sentinel_pid_is_a_new_run_of_the_cluster_and_starts_afresh(clock, monkeypatch):
    heartbeat_record_turn(jobs_leased=5, rows_deleted=50)
    clock.shift(600)
    monkeypatch.setattr(health.os, "getppid", lambda: 5151)
    heartbeat_on_spawn(sender="django_q", proc_name="Process-1")
    row = WorkerHeartbeat.objects.get()
    assert row.pid == 5151
    assert row.started_at == NOW + timedelta(seconds=600)
    assert row.last_progress_at is None
    assert (row.turns, row.jobs_leased, row.rows_deleted) == (0, 0, 0)


def test_a_respawned_worker_of_the_same_run_keeps_its_clusters_start_and_progress(clock):
    heartbeat_record_turn(jobs_leased=5, rows_deleted=50)
    clock.shift(30)
    heartbeat_on_spawn(sender="django_q", proc_name="Process-2")  # a killed worker, reincarnated
    row = WorkerHeartbeat.objects.get()
    assert (row.started_at, row.last_progress_at, row.turns) == (NOW, NOW, 1)


def test_a_spawning_worker_wakes_the_dispatcher(due_work):
    CleanupJob.objects.update(enqueued_at=None)
    heartbeat_on_spawn(sender="django_q", proc_name="Process-1")
    assert CleanupJob.objects.filter(enqueued_at__isnull=False).count() == 1


def test_liveness_passes_for_an_idle_cluster_however_long_ago_its_last_progress(clock):
    heartbeat_record_turn()
    clock.shift(3600)
    code, report = liveness()
    assert code == 0
    assert report["detail"] == "idle: no due work it could take"
    assert report["heartbeat"]["seconds_since_progress"] == 3600


def test_liveness_fails_when_due_work_waited_and_the_cluster_made_no_progress_for_the_stale_time(due_work, clock):
    heartbeat_record_turn()
    clock.shift(121)
    code, report = liveness()
    assert code == 1
    assert report["ok"] is False
    assert report["detail"].startswith("wedged: due work has waited 121 s and the cluster made no progress for 121 s")
    assert report["heartbeat"]["pid"] == 4242


def test_liveness_passes_while_the_cluster_makes_progress(due_work, clock):
    clock.shift(300)
    heartbeat_record_turn(jobs_leased=1)
    clock.shift(60)
    code, report = liveness()
    assert code == 0
    assert report["detail"] == "progress 60 s ago"


def test_new_due_work_gives_an_idle_cluster_the_stale_time_to_take_it(clock, portfolio, prop, active_policy):
    heartbeat_record_turn()
    clock.shift(3600)  # idle for an hour, then a sweep is admitted
    active_policy(portfolio, "lease", 365)
    make_records(prop, "lease", 5, ended=OLD)
    sweep_trigger()
    clock.shift(30)
    assert liveness()[0] == 0
    clock.shift(100)
    assert liveness()[0] == 1


def test_a_restarted_cluster_gets_the_stale_time_from_its_start(due_work, clock, monkeypatch):
    heartbeat_record_turn()
    clock.shift(300)
    monkeypatch.setattr(health.os, "getppid", lambda: 5151)
    heartbeat_on_spawn(sender="django_q", proc_name="Process-1")
    clock.shift(60)
    code, report = liveness()
    assert code == 0
    assert report["detail"] == "progress 60 s ago"


def test_liveness_ignores_due_work_in_a_paused_portfolio(due_work, clock):
    heartbeat_record_turn()
    pipeline_pause(actor=None, reason="maintenance window", portfolio_id=due_work.pk)
    clock.shift(600)
    code, report = liveness()
    assert code == 0
    assert report["detail"] == "idle: no due work it could take"


def test_liveness_fails_when_this_cluster_never_reported_and_work_has_waited(due_work, clock):
    clock.shift(121)
    code, report = liveness()
    assert code == 1
    assert report["heartbeat"] is None
    assert "never reported" in report["detail"]


def test_stale_seconds_comes_from_the_flag_or_the_setting(due_work, clock, settings):
    heartbeat_record_turn()
    clock.shift(40)
    assert liveness()[0] == 0
    assert liveness("--stale-seconds", "30")[0] == 1
    settings.CLEANUP_LIVENESS_STALE_SECONDS = 30
    assert liveness()[0] == 1


def test_liveness_is_not_judged_while_the_database_is_unreachable(due_work, monkeypatch):
    def unreachable(**kwargs: object) -> list[int]:
        raise OperationalError("connection refused")

    monkeypatch.setattr(health, "fair_due_job_ids", unreachable)
    report = cluster_liveness(host="h", cluster="c")
    assert report.ok
    assert report.detail == "not judged: the database is unreachable (OperationalError)"


def test_readiness_passes_on_a_migrated_database_with_its_cache_table():
    out = StringIO()
    call_command("cleanup_health", "--readiness", stdout=out)
    assert out.getvalue().strip() == "readiness: ok: database reachable, migrations applied"


def test_readiness_fails_while_a_migration_is_not_applied():
    (latest,) = MigrationLoader(connection).graph.leaf_nodes("cleanup_ops")
    MigrationRecorder(connection).migration_qs.filter(app="cleanup_ops", name=latest[1]).delete()
    out = StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command("cleanup_health", "--readiness", "--json", stdout=out)
    assert exit_info.value.code == 1
    report = json.loads(out.getvalue())["checks"][0]
    assert report["unapplied_migrations"] == [f"cleanup_ops.{latest[1]}"]
    assert report["detail"] == "1 migrations not applied (run migrate)"


def test_readiness_fails_while_a_cache_table_is_missing(settings):
    settings.CACHES = {
        **settings.CACHES,
        "other": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "never_created"},
    }
    out = StringIO()
    with pytest.raises(SystemExit):
        call_command("cleanup_health", "--readiness", stdout=out)
    assert "cache tables missing: never_created (run createcachetable)" in out.getvalue()


def test_cleanup_health_needs_a_check_and_a_positive_stale_time():
    with pytest.raises(CommandError, match="give --liveness, --readiness or both"):
        call_command("cleanup_health")
    with pytest.raises(CommandError, match="--stale-seconds: must be a positive"):
        call_command("cleanup_health", "--liveness", "--stale-seconds", "0")


def test_both_checks_at_once_fail_if_either_fails(due_work, clock):
    clock.shift(121)
    out = StringIO()
    with pytest.raises(SystemExit):
        call_command("cleanup_health", "--readiness", "--liveness", "--json", stdout=out)
    result = json.loads(out.getvalue())
    assert result["ok"] is False
    assert [(c["check"], c["ok"]) for c in result["checks"]] == [("readiness", True), ("liveness", False)]


def test_the_purge_clusters_liveness_judges_only_the_purge_jobs_its_queue_carries(due_work, clock, monkeypatch):
    monkeypatch.setenv("Q_CLUSTER_NAME", "retention-purge")
    clock.shift(600)
    code, report = liveness()
    assert code == 0
    assert report["job_kinds"] == ["purge"]
    assert report["detail"] == "idle: no due work it could take"


@pytest.mark.parametrize(
    "path",
    [
        "/admin/django_q/success/",
        "/admin/django_q/failure/",
        "/admin/django_q/schedule/",
        "/admin/django_q/ormq/",
        "/admin/cleanup_ops/workerheartbeat/",
    ],
)
def test_operators_may_view_django_q2s_admin_pages_and_the_heartbeats(client, operator_user, path):
    heartbeat_record_turn()
    client.force_login(operator_user)
    assert client.get(path).status_code == 200


def test_the_heartbeats_are_read_only_in_the_admin(client, operator_user):
    heartbeat_record_turn()
    client.force_login(operator_user)
    row = WorkerHeartbeat.objects.get()
    assert client.post(f"/admin/cleanup_ops/workerheartbeat/{row.pk}/delete/", {"post": "yes"}).status_code == 403
    assert WorkerHeartbeat.objects.filter(pk=row.pk).exists()


def test_a_property_manager_may_not_view_django_q2s_admin_pages(client, manager):
    client.force_login(manager)
    assert client.get("/admin/django_q/success/").status_code == 403


def test_a_task_starting_is_progress_under_the_same_throttle(clock, monkeypatch, settings):
    settings.CLEANUP_HEARTBEAT_SECONDS = 5
    monotonic = [1000.0]
    monkeypatch.setattr(health.time, "monotonic", lambda: monotonic[0])
    heartbeat_on_task_start(sender="django_q", func=None, task={})
    row = WorkerHeartbeat.objects.get()
    assert (row.last_progress_at, row.turns) == (NOW, 0)
    clock.shift(2)
    monotonic[0] += 2
    with CaptureQueriesContext(connection) as queries:
        heartbeat_on_task_start(sender="django_q", func=None, task={})
        heartbeat_record_turn(jobs_leased=1)
    assert len(queries) == 0
    clock.shift(4)
    monotonic[0] += 4
    heartbeat_on_task_start(sender="django_q", func=None, task={})
    row.refresh_from_db()
    assert (row.last_progress_at, row.turns, row.jobs_leased) == (NOW + timedelta(seconds=6), 1, 1)


def test_a_failing_task_start_heartbeat_never_reaches_the_worker(monkeypatch):
    def broken(**kwargs: object) -> bool:
        raise RuntimeError("anything at all")

    monkeypatch.setattr(health, "_write_if_due", broken)
    heartbeat_on_task_start(sender="django_q", func=None, task={})  # does not raise


def test_a_task_finished_inside_the_throttle_interval_is_written_once_the_interval_has_passed(
    clock, monkeypatch, settings
):
    """The lost turn: a task starts (a write), finishes two seconds later
    (throttled) and no other task follows. The throttled call asks for a flush
    at the end of the interval, and the flush writes the turn."""
    settings.CLEANUP_HEARTBEAT_SECONDS = 5
    monotonic = [1000.0]
    monkeypatch.setattr(health.time, "monotonic", lambda: monotonic[0])
    asked: list[float] = []
    monkeypatch.setattr(health, "_flush_later", asked.append)
    heartbeat_on_task_start(sender="django_q", func=None, task={})
    clock.shift(2)
    monotonic[0] += 2
    assert not heartbeat_record_turn(jobs_leased=1, rows_deleted=7)
    assert asked == [3.0]
    row = WorkerHeartbeat.objects.get()
    assert (row.turns, row.last_progress_at) == (0, NOW)
    assert not health.heartbeat_flush()  # too early: still inside the interval
    clock.shift(3)
    monotonic[0] += 3
    assert health.heartbeat_flush()
    row.refresh_from_db()
    assert (row.turns, row.jobs_leased, row.rows_deleted) == (1, 1, 7)
    assert row.last_progress_at == NOW + timedelta(seconds=2)
    assert not health.heartbeat_flush()  # nothing left to write


def test_a_heartbeat_names_the_queue_its_cluster_serves(clock, monkeypatch, settings):
    monkeypatch.setenv("Q_CLUSTER_NAME", settings.Q_PURGE_CLUSTER)
    heartbeat_record_turn()
    assert WorkerHeartbeat.objects.get().queue == settings.Q_PURGE_CLUSTER
