"""Issue 30 in a real browser (headless Chromium via Playwright, like
``test_console_browser``): the incident demo's printed recovery followed
literally (item 2), run now on a paused portfolio (item 7), the overview
during an incident (item 11) and actions shown only to those who may take
them (item 12).

The recovery walk runs the commands ``demo_incident`` prints as they are —
the document store started again, a delete cluster and a purge cluster, each
a real process against this test's database — and the console steps in the
browser (the test's live server stands in for ``runserver``), and ends with
nothing open.

Times are real (no time machine): the browser's cookies and the clusters
live in real time.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from django_q.models import Schedule
from playwright.sync_api import expect

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, PipelinePause, WorkerHeartbeat
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.recovery.operator import pipeline_pause
from cleanup_ops.schedule import sweep_trigger
from demo.services import DEMO_PASSWORD
from harness.qcluster import QCluster
from properties.models import Portfolio, Property
from retention.models import Membership

from . import chromium
from .chromium import log_in, log_in_admin, needs_chromium
from .conftest import make_records, make_user, utc

browser = chromium.browser
page = chromium.page

ROOT = Path(__file__).resolve().parent.parent
DEMO_ARGS = ["--portfolios", "3", "--properties-per-portfolio", "2", "--records-per-property", "30", "--seed", "3"]
REASON = "the document store answers again after the incident"
BROWSER_REASON = "Birch's store is back, try it now"
OLD = utc("2020-01-01T00:00:00Z")

pytestmark = [
    needs_chromium,
    pytest.mark.django_db(transaction=True),
]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def printed_commands(printed: str) -> list[str]:
    """The commands of the printed recovery: its lines indented by seven spaces."""
    recovery = printed.split("To recover", 1)[1]
    return [line.strip() for line in recovery.splitlines() if line.startswith(" " * 7) and line.strip()]


def as_shell_would(command: str, base_env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """``K=V … program args`` split as a POSIX shell does it: the environment and the argv."""
    words = shlex.split(command)
    env = dict(base_env)
    while words and "=" in words[0] and not words[0].startswith(("-", ".", "/")):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    return env, words


def demo_user_logs_in(tab, username: str) -> None:  # type: ignore[no-untyped-def]
    tab.goto("/accounts/login/")
    tab.get_by_label("Username").fill(username)
    tab.get_by_label("Password").fill(DEMO_PASSWORD)
    tab.get_by_role("button", name="Log in").click()
    tab.wait_for_url("**/console/")


@pytest.fixture
def processes() -> Iterator[Callable[[str, dict[str, str]], object]]:
    """Start a printed command as its own process; every one is stopped at the end and must not survive."""
    clusters: list[QCluster] = []
    others: list[subprocess.Popen[str]] = []

    def start(command: str, base_env: dict[str, str]) -> object:
        env, argv = as_shell_would(command, base_env)
        if argv[1:] == ["manage.py", "qcluster"]:
            cluster = QCluster(env, cwd=ROOT, python=argv[0])
            clusters.append(cluster)
            return cluster
        proc = subprocess.Popen(  # noqa: S603 - the demo's own printed command
            argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        others.append(proc)
        return proc

    yield start
    survivors = {cluster.pid: cluster.stop(grace=30) for cluster in clusters}
    for proc in others:
        proc.terminate()
        proc.wait(timeout=10)
    assert not any(survivors.values()), f"processes of stopped clusters survived: {survivors}"


def test_the_incident_demos_printed_recovery_followed_literally_ends_with_nothing_open(
    page, docstore_factory, tmp_path, processes, settings
) -> None:
    # The demo as `make demo-incident` runs it, with its store on a port of its own …
    store = docstore_factory()
    store_db = str(tmp_path / "docstore-0.sqlite3")
    call_command("seed_demo", *DEMO_ARGS, stdout=StringIO())
    call_command("seed_attachments", "--fraction", "0.5", "--seed", "3", stdout=StringIO())
    port = free_port()
    out = StringIO()
    call_command(
        "demo_incident", "--max-seconds", "5", "--docstore-db", store_db, "--docstore-port", str(port), stdout=out
    )
    store.stop()  # … and stopped when it ends, as the Makefile does.
    printed = out.getvalue()
    letters = DeadLetter.objects.open().count()
    assert letters and set(DeadLetter.objects.open().values_list("job__job_kind", flat=True)) == {"purge"}
    paused = Portfolio.objects.get(pk=PipelinePause.objects.active().get().portfolio_id)
    # The periodic dispatcher a migrated database has (a transactional test's flush removed it).
    Schedule.objects.update_or_create(
        name="cleanup_dispatch",
        defaults={"func": "cleanup_ops.tasks.dispatch", "schedule_type": "I", "minutes": 1, "repeats": -1},
    )

    # The printed commands, as they are; the shell of the reader has this test's database.
    db = connection.settings_dict
    shell_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("CLEANUP_", "Q_", "DOCSTORE_"))},
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "LOG_LEVEL": "ERROR",
    }
    commands = printed_commands(printed)
    assert [c for c in commands if "docstore" in c and "-m docstore" in c], commands
    assert any("Q_CLUSTER_NAME=retention-purge" in c and f"DOCSTORE_URL=http://127.0.0.1:{port}" in c for c in commands)
    for command in commands:
        if command.endswith("manage.py runserver"):
            continue  # the test's live server is the console
        started = processes(command, shell_env)
        if isinstance(started, subprocess.Popen):  # the store: wait until it listens
            assert started.stdout is not None
            assert started.stdout.readline().startswith("docstore listening on"), command

    # The console steps, in the browser.
    demo_user_logs_in(page, "operator")
    page.goto("/console/pauses/")
    page.get_by_label(f"reason to resume {paused.name}").fill(REASON)
    page.get_by_role("button", name=f"Resume {paused.name}").click()
    page.wait_for_url("**/console/pauses/")
    assert not PipelinePause.objects.active().exists()
    page.goto("/console/dead-letters/")
    page.get_by_test_id("bulk-redrive").click()
    page.get_by_label("reason").fill(REASON)
    page.get_by_role("button", name=f"Redrive all {letters}").click()
    page.wait_for_url("**/console/dead-letters/**")

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if not CleanupJob.objects.open().exists() and not DeadLetter.objects.open().exists():
            break
        time.sleep(1)
    open_jobs = list(CleanupJob.objects.open().values_list("id", "job_kind", "state"))
    again = list(DeadLetter.objects.open().values_list("category", "error_class"))
    assert not open_jobs and not again, (open_jobs, again)
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {"redriven"}

    page.goto("/console/")
    assert page.get_by_test_id("pipeline-state").inner_text() == "Pipeline running"
    assert page.get_by_test_id("letters-open").inner_text() == "0"
    workers = page.get_by_test_id("workers-card").inner_text()
    assert "none reporting" not in workers


# --- Items 7, 11 and 12 -----------------------------------------------------------------


@pytest.fixture
def incident(portfolio, active_policy):  # type: ignore[no-untyped-def]
    """Acme (Harbour House, one dead letter) and Birch (Birch Row, a pending job, Birch paused)."""
    birch = Portfolio.objects.create(name="Birch Estates", slug="birch")
    active_policy(portfolio, "lease", 365)
    active_policy(birch, "lease", 365)
    make_records(Property.objects.create(portfolio=portfolio, name="Harbour House"), "lease", 2, ended=OLD)
    make_records(Property.objects.create(portfolio=birch, name="Birch Row"), "lease", 2, ended=OLD)
    sweep_trigger()
    acme_job = CleanupJob.objects.get(portfolio_id=portfolio.pk)
    job_run_slice(job_id=acme_job.pk, before_batch=rejected)
    pipeline_pause(actor=None, reason="Birch asked us to wait", portfolio_id=birch.pk)
    return {"acme": portfolio, "birch": birch, "birch_job": CleanupJob.objects.get(portfolio_id=birch.pk)}


def rejected(job_id: int) -> None:
    raise DownstreamError(400)


def a_live_cluster() -> WorkerHeartbeat:
    now = timezone.now()
    return WorkerHeartbeat.objects.create(
        host="worker-1", cluster="default", queue="", pid=7, started_at=now, last_progress_at=now, updated_at=now
    )


def test_run_now_on_a_paused_portfolios_job_says_it_waits_for_the_resume_and_the_rows_say_paused(
    page, incident
) -> None:
    a_live_cluster()
    make_user("op", "operator")
    log_in(page, "op")
    job = incident["birch_job"]
    page.goto(f"/console/jobs/{job.pk}/")
    assert "paused" in page.get_by_test_id("job-paused").inner_text()
    page.get_by_label("job action", exact=True).select_option("run_now")
    page.get_by_label("job action reason").fill(BROWSER_REASON)
    page.get_by_role("button", name="Apply").click()
    page.wait_for_url(f"**/console/jobs/{job.pk}/")
    said = " | ".join(page.get_by_test_id("message").all_inner_texts())
    assert "as soon as a worker takes them" not in said
    assert "will not run while portfolio Birch Estates is paused (Birch asked us to wait)" in said
    page.goto("/console/jobs/?state=pending")
    assert page.get_by_test_id(f"job-{job.pk}").get_by_test_id("job-paused").inner_text() == "paused"


def test_the_overview_during_an_incident_says_what_needs_an_operator_and_shows_the_workers(page, incident) -> None:
    make_user("op", "operator")
    log_in(page, "op")
    banner = page.get_by_test_id("pipeline-state").inner_text()
    assert "Pipeline running" not in banner
    assert "1 open job waits for a paused portfolio to be resumed" in banner
    assert "1 dead letter waits for a decision" in banner
    assert page.get_by_test_id("oldest-due").inner_text() == "none can run"
    card = page.get_by_test_id("workers-card").inner_text()
    assert "none reporting — start one: python manage.py qcluster" in card


def test_a_customers_manager_sees_no_release_and_a_reviewer_no_submit_in_the_admin(page, incident) -> None:
    from retention.services import legal_hold_place, retention_policy_get_or_create

    acme = incident["acme"]
    reviewer = make_user("rev-acme")
    Membership.objects.create(user=reviewer, portfolio=acme, role="compliance_reviewer")
    manager = make_user("pm-acme")
    Membership.objects.create(user=manager, portfolio=acme, role="property_manager")
    hold = legal_hold_place(portfolio=acme, placed_by=reviewer, reason="litigation pending")
    policy = retention_policy_get_or_create(portfolio=acme, record_kind="lease")

    log_in_admin(page, "pm-acme")
    page.goto("/admin/retention/legalhold/")
    row = page.locator("#result_list tbody tr").first
    assert "active" in row.inner_text() and row.get_by_role("link", name="Release…").count() == 0
    page.goto(f"/admin/retention/legalhold/{hold.pk}/change/")
    assert page.get_by_role("button", name="Save").count() == 0
    assert page.get_by_role("link", name="reviewer").count() == 0  # users as names, not 403 links
    page.goto(f"/admin/retention/retentionpolicy/{policy.pk}/change/")
    expect(page.get_by_role("link", name="Submit a new version")).to_be_visible()

    page.context.clear_cookies()
    log_in_admin(page, "rev-acme")
    page.goto(f"/admin/retention/retentionpolicy/{policy.pk}/change/")
    assert page.get_by_role("link", name="Submit a new version").count() == 0
    page.goto("/admin/retention/legalhold/")
    assert page.get_by_role("link", name="Release…").count() == 1


def test_the_hold_forms_property_picker_offers_the_chosen_portfolios_properties_only(page, incident) -> None:
    """Item 1: the picker offered every property the user could see, whatever the portfolio."""
    make_user("rev", "compliance_reviewer")
    log_in_admin(page, "rev")
    page.goto("/admin/retention/legalhold/add/")
    page.get_by_label("Portfolio").select_option(label="Birch Estates")
    page.locator(".field-property .select2-selection").click()
    page.locator(".select2-search__field").fill("o")
    options = page.locator(".select2-results__option")
    options.first.wait_for()
    # The dropdown first shows the answer to its opening query, then to the
    # typed term: wait (not sleep) until the last answer has landed.
    expect(options).to_have_text(["Birch Row"], timeout=10_000)
