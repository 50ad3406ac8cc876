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
from django_q.models import Schedule

from cleanup_ops.models import CleanupJob, DeadLetter, PipelinePause
from demo.services import DEMO_PASSWORD
from harness.qcluster import QCluster
from properties.models import Portfolio

from . import test_console_browser as browser_tests
from .test_console_browser import CHROMIUM

browser = browser_tests.browser
page = browser_tests.page

ROOT = Path(__file__).resolve().parent.parent
DEMO_ARGS = ["--portfolios", "3", "--properties-per-portfolio", "2", "--records-per-property", "30", "--seed", "3"]
REASON = "the document store answers again after the incident"

pytestmark = [
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM),
        reason=f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium); CI installs it",
    ),
    pytest.mark.postgres,
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
    assert letters and set(DeadLetter.objects.open().values_list("job__kind", flat=True)) == {"purge"}
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
    open_jobs = list(CleanupJob.objects.open().values_list("id", "kind", "state"))
    again = list(DeadLetter.objects.open().values_list("category", "error_class"))
    assert not open_jobs and not again, (open_jobs, again)
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {"redriven"}

    page.goto("/console/")
    assert page.get_by_test_id("pipeline-state").inner_text() == "Pipeline running"
    assert page.get_by_test_id("letters-open").inner_text() == "0"
    workers = page.get_by_test_id("workers-card").inner_text()
    assert "none reporting" not in workers
