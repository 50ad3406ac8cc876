"""Every broker (``Q_BROKER``) against its real server: ORM on PostgreSQL, redis-server,
moto's SQS server on loopback, rabbitmq-server.

``make test`` (scripts/test.sh) starts each server that is installed on a free loopback
port and exports its variables (``harness/brokers.py``); a broker whose server is absent
is skipped here with the reason, and CI installs them all (CI fails on a skip).

The drain test is the issue's "done when": a sweep drained exactly once through real
``qcluster`` workers — the delete cluster and the purge cluster, each on its own queue —
while a worker holding a lease is SIGKILLed mid-drain.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Sum
from django.utils import timezone
from django_q.conf import Conf
from django_q.models import Schedule, Task
from django_q.signing import SignedPackage

from cleanup_ops import brokers
from cleanup_ops.models import CleanupJob, JobKind, JobState, LedgerEntry
from harness.brokers import reset
from harness.qcluster import QCluster
from properties.models import Lease
from retention.services import (
    legal_hold_place,
)

from .conftest import make_lease_estate, make_user, utc

ROOT = Path(__file__).resolve().parent.parent
PORTFOLIOS, PROPERTIES, ROWS = 3, 2, 60
HELD = 3
DOCUMENT_EVERY = 4  # every 4th lease has an attachment in the document store

BROKER_VARS = {
    "orm": [],
    "redis": ["Q_REDIS_URL"],
    "sqs": ["Q_SQS_ENDPOINT_URL", "Q_SQS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"],
    "rabbitmq": ["Q_AMQP_URL"],
}
SERVER = {"redis": "redis-server", "sqs": "moto's SQS server (moto[server])", "rabbitmq": "rabbitmq-server"}

# One broker server of each kind serves the whole run (scripts/test.sh), its queues
# named after the clusters: under pytest-xdist the tests on them (broker_env) run on
# one worker, in turn. The dispatch tests on the ORM broker (rolled back, in each
# worker's own database) are in no group.
BROKERS = pytest.mark.xdist_group("brokers")


@pytest.fixture(params=list(BROKER_VARS))
def broker_env(request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    """(kind, the variables a process needs to run on it), the broker emptied first."""
    kind = request.param
    missing = [name for name in BROKER_VARS[kind] if not os.environ.get(name)]
    if missing:
        pytest.skip(
            f"no {kind} server: {', '.join(missing)} not set (`make test` starts {SERVER[kind]} when it is installed)"
        )
    env = {"Q_BROKER": kind, **{name: os.environ[name] for name in BROKER_VARS[kind]}}
    if kind != "orm":
        reset(kind, env)
    return kind, env


# --------------------------------------------------------------------------- the broker classes


@pytest.fixture
def broker_of(broker_env, settings, monkeypatch) -> Iterator[Callable[[str], object]]:  # type: ignore[no-untyped-def]
    """Instances of the configured broker class in this process, on queues of their own."""
    kind, env = broker_env
    classes = {
        "orm": brokers.DelayableORM,
        "redis": brokers.DelayableRedis,
        "sqs": brokers.EndpointSqs,
        "rabbitmq": brokers.RabbitMQ,
    }
    if kind == "redis":
        monkeypatch.setattr(Conf, "REDIS", env["Q_REDIS_URL"])
    if kind == "sqs":
        monkeypatch.setattr(Conf, "SQS", {"aws_region": env["Q_SQS_REGION"]})
        settings.Q_SQS_ENDPOINT_URL = env["Q_SQS_ENDPOINT_URL"]
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(name, env[name])
    if kind == "rabbitmq":
        settings.Q_AMQP_URL = env["Q_AMQP_URL"]
    made = []

    def make(queue: str) -> object:
        instance = classes[kind](list_key=queue)
        instance.purge_queue()
        made.append(instance)
        return instance

    yield make
    for instance in made:
        if kind == "rabbitmq":
            instance.connection.close()


def signed(job_id: int) -> str:
    return SignedPackage.dumps({"id": f"t{job_id}", "func": "cleanup_ops.tasks.run_job", "args": (job_id,)})


def fetch(broker: object, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = broker.dequeue()
        if got:
            for ack_id, _ in got:
                broker.acknowledge(ack_id)
            return [body.decode() if isinstance(body, bytes) else body for _, body in got]
        time.sleep(0.05)
    return []


@BROKERS
@pytest.mark.django_db(transaction=True)
def test_a_message_goes_through_and_is_counted_while_it_waits(broker_of, broker_env):
    broker = broker_of("retention-test")
    broker.enqueue(signed(1))
    broker.enqueue(signed(2))
    deadline = time.monotonic() + 5  # SQS's count is approximate: moto's is exact, AWS's lags
    while broker.queue_size() != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert broker.queue_size() == 2
    got = fetch(broker, 10) + fetch(broker, 10)  # one at a time (bulk 1); SQS keeps no strict order
    assert sorted(SignedPackage.loads(body)["args"] for body in got) == [(1,), (2,)]
    assert broker.queue_size() == 0


@BROKERS
@pytest.mark.django_db(transaction=True)
def test_a_due_at_hint_is_held_back_until_its_instant_never_early(broker_of, broker_env):
    broker = broker_of("retention-test")
    due = timezone.now() + timedelta(seconds=3)
    with brokers.not_before(due):
        broker.enqueue(signed(7))
    assert broker.queue_size() == 0  # held back: not counted against the dispatch window
    assert fetch(broker, 1.5) == []
    got = fetch(broker, 10)
    arrived = timezone.now()
    assert [SignedPackage.loads(body)["args"] for body in got] == [(7,)]
    assert arrived >= due
    assert (arrived - due).total_seconds() < 2.5, "delivered long after it was due"


@BROKERS
@pytest.mark.parametrize("broker_env", ["rabbitmq", "sqs"], indirect=True)  # ORM and Redis drop such a message
@pytest.mark.django_db(transaction=True)
def test_a_message_a_cluster_rejects_is_dead_lettered_for_inspection(broker_of, broker_env):
    broker = broker_of("retention-test")
    before = broker.dead_letter_queue_size()  # the dead-letter queue outlives a test
    broker.enqueue("not a signed django-q2 package")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and broker.dead_letter_queue_size() == before:
        # What django-q2's pusher does with a message it cannot read.
        for ack_id, body in broker.dequeue() or []:
            try:
                SignedPackage.loads(body)
            except Exception:
                broker.fail(ack_id)
        time.sleep(0.05)
    assert broker.dead_letter_queue_size() == before + 1
    assert broker.queue_size() == 0


def test_amqp_delay_buckets_round_up_and_stay_few():
    assert brokers.amqp_delay_bucket_ms(0.2) == 1000
    assert brokers.amqp_delay_bucket_ms(59.01) == 60_000
    assert brokers.amqp_delay_bucket_ms(61) == 70_000
    assert brokers.amqp_delay_bucket_ms(1799) == 1_800_000
    assert len({brokers.amqp_delay_bucket_ms(s / 10) for s in range(1, 18_000)}) == 60 + 54 + 20


# --------------------------------------------------------------------------- real qclusters


def cluster_env(broker: dict[str, str], docstore_url: str) -> dict[str, str]:
    db = connection.settings_dict
    base = {k: v for k, v in os.environ.items() if k not in {"Q_BROKER", "Q_CLUSTER_NAME"}}
    return {
        **base,
        **broker,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "DOCSTORE_URL": docstore_url,
        "Q_WORKERS": "2",
        "Q_PURGE_WORKERS": "1",
        "CLEANUP_BATCH_SIZE": "4",
        "CLEANUP_SLICE_BATCHES": "2",
        "CLEANUP_LEASE_JOBS": "1",
        "CLEANUP_LEASE_SECONDS": "6",
        "DOCSTORE_CONNECT_TIMEOUT": "1",
        "DOCSTORE_READ_TIMEOUT": "3",
        "CLEANUP_RATE_GLOBAL": "15",  # ~90 delete batches: a drain of several seconds to kill a worker in
        "CLEANUP_BURST_GLOBAL": "3",
        "CLEANUP_HEARTBEAT_SECONDS": "0",
        "Q_SQS_WAIT_SECONDS": "1",  # SQS long poll: a cluster stops within a poll
        "LOG_LEVEL": "INFO",
    }


@pytest.fixture
def estate(docstore) -> dict[str, object]:  # type: ignore[no-untyped-def]
    props = make_lease_estate(portfolios=PORTFOLIOS, properties=PROPERTIES, rows=ROWS)
    reviewer = User.objects.get(username="r")
    documents = []
    for index, lease in enumerate(Lease.objects.order_by("id")):
        if index % DOCUMENT_EVERY == 0:
            lease.document_id = f"doc-{lease.pk}"
            lease.save(update_fields=["document_id"])
            documents.append(lease.document_id)
    docstore.create(*documents)
    held = list(Lease.objects.filter(property=props[0]).order_by("id").values_list("id", flat=True)[1 : HELD + 1])
    for record_id in held:
        legal_hold_place(
            portfolio=props[0].portfolio,
            record_kind="lease",
            record_id=record_id,
            placed_by=reviewer,
            reason="hold for the tests",
        )
    held_documents = set(
        Lease.objects.filter(pk__in=held, document_id__isnull=False).values_list("document_id", flat=True)
    )
    # The periodic dispatcher (a migration installs it; a transactional test's flush removed it).
    Schedule.objects.update_or_create(
        name="cleanup_dispatch",
        defaults={"func": "cleanup_ops.tasks.dispatch", "schedule_type": "I", "minutes": 1, "repeats": -1},
    )
    return {"documents": set(documents) - held_documents, "held": held, "store": docstore}


def wait_for(predicate: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


def open_jobs(**filters: object) -> int:
    return CleanupJob.objects.open().filter(**filters).count()


@BROKERS
@pytest.mark.django_db(transaction=True)
def test_each_broker_drains_a_sweep_exactly_once_with_a_worker_killed_mid_drain(broker_env, estate, tmp_path):
    kind, broker = broker_env
    env = cluster_env(broker, estate["store"].url)
    started: list[QCluster] = []

    def start(name: str, extra: dict[str, str], workers: int) -> QCluster:
        cluster = QCluster(
            {**env, **extra}, cwd=ROOT, workers=workers, log_path=tmp_path / f"qcluster-{name}.log", log=print
        )
        started.append(cluster)
        return cluster

    try:
        deleting = start("delete", {"CLEANUP_CLUSTER_NAME": "delete"}, workers=2)
        purging = start("purge", {"Q_CLUSTER_NAME": "retention-purge", "CLEANUP_CLUSTER_NAME": "purge"}, workers=1)
        deleting.wait_ready()
        purging.wait_ready()
        # The nightly cron line, in its own process on the same broker.
        trigger = subprocess.run(
            [sys.executable, "manage.py", "cleanup_sweep", "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert trigger.returncode == 0, trigger.stderr
        assert '"jobs_admitted": 6' in trigger.stdout

        # A delete worker holding a lease, SIGKILLed: mid-slice, so it holds no queue lock.
        victim: dict[str, int] = {}

        def leased_by_a_delete_worker() -> bool:
            for job_id, owner in CleanupJob.objects.filter(
                state=JobState.LEASED, job_kind=JobKind.DELETE, lease_expires_at__gt=timezone.now()
            ).values_list("id", "lease_owner"):
                pid = int(owner.rsplit(":", 1)[-1]) if owner.rsplit(":", 1)[-1].isdigit() else 0
                if pid in deleting.worker_pids:
                    victim.update(job=job_id, pid=pid)
                    return True
            return False

        assert wait_for(leased_by_a_delete_worker, timeout=60), "no delete worker ever held a lease"
        os.kill(victim["pid"], signal.SIGKILL)
        assert open_jobs(job_kind=JobKind.DELETE) > 0, "the drain was over before the kill"

        drained = wait_for(lambda: open_jobs() == 0, timeout=180, step=0.5)
        assert drained, (
            f"{kind}: {open_jobs()} jobs still open\n{deleting.log_text()[-3000:]}\n{purging.log_text()[-2000:]}"
        )
    finally:
        survivors = {cluster.pid: cluster.stop(grace=30) for cluster in started}
    assert not any(survivors.values()), f"processes survived the clusters' stop: {survivors}"

    # Exactly once: only held rows remain, the ledger matches what is gone, no operation twice.
    assert set(Lease.objects.values_list("id", flat=True)) == set(estate["held"])
    gone = PORTFOLIOS * PROPERTIES * ROWS - HELD
    assert LedgerEntry.objects.aggregate(n=Sum("rows_deleted"))["n"] == gone
    operation_ids = list(LedgerEntry.objects.values_list("operation_id", flat=True))
    assert len(operation_ids) == len(set(operation_ids))
    assert CleanupJob.objects.get(pk=victim["job"]).state == JobState.DONE
    assert set(CleanupJob.objects.filter(job_kind=JobKind.DELETE).values_list("outcome", flat=True)) == {"deleted"}
    assert not CleanupJob.objects.filter(state=JobState.DEAD).exists()
    # Every file of a deleted record purged once, none of a held record's.
    applied = Counter(
        r["path"].rsplit("/", 1)[-1]
        for r in estate["store"].requests("DELETE")
        if r.get("status") == 204 and not r.get("replayed")
    )
    assert set(applied) == estate["documents"]
    assert max(applied.values()) == 1
    # Each queue carried its own kind: deletes on the delete cluster, purges on the purge cluster.
    kinds = dict(CleanupJob.objects.values_list("id", "job_kind"))
    ran = {(task.cluster, kinds.get(task.args[0])) for task in Task.objects.filter(func="cleanup_ops.tasks.run_job")}
    assert ran <= {("retention", JobKind.DELETE), ("retention-purge", JobKind.PURGE)}, ran
    assert ("retention-purge", JobKind.PURGE) in ran


@BROKERS
@pytest.mark.django_db(transaction=True)
def test_cleanup_status_counts_the_waiting_messages_through_the_broker_interface(broker_of, broker_env):
    kind, env = broker_env
    queue = broker_of("retention")
    for job_id in (1, 2, 3):
        queue.enqueue(signed(job_id))
    result = subprocess.run(
        [sys.executable, "manage.py", "cleanup_status", "--json"],
        cwd=ROOT,
        env=cluster_env(env, docstore_url=""),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout.strip().splitlines()[-1])["broker"]
    assert status["broker"] == kind
    assert status["queues"]["retention"] == {"kinds": ["delete"], "window": 4, "waiting": 3}
    assert status["queues"]["retention-purge"]["kinds"] == ["purge"]


# --------------------------------------------------------------------------- dispatch over queues (ORM)


@pytest.fixture
def jobs(portfolio, active_policy, settings):  # type: ignore[no-untyped-def]
    """``jobs(kind, n)``: n due jobs of ``kind`` in one portfolio; the dispatcher not in sync mode."""
    from cleanup_ops.models import Sweep

    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": False, "workers": 2}
    settings.CLEANUP_DISPATCH_WINDOW = 0
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = 50
    version = active_policy(portfolio, "lease", 365)
    now = timezone.now()
    sweep = Sweep.objects.create(key="cleanup:2026-08-21T02:00Z", slot=utc("2026-08-21T02:00:00Z"))
    counter = iter(range(1, 10_000))

    def make(kind: str, count: int) -> list[int]:
        made = []
        for _ in range(count):
            n = next(counter)
            made.append(
                CleanupJob.objects.create(
                    sweep=sweep,
                    key=f"{sweep.key}:{n}:{kind}",
                    job_kind=kind,
                    portfolio_id=portfolio.pk,
                    property_id=n,
                    record_kind="lease",
                    policy_version=version,
                    cutoff=now - timedelta(days=365),
                    available_at=now - timedelta(seconds=60 - n),
                ).pk
            )
        return made

    return make


@pytest.fixture
def commit(django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    """``commit(f)``: call ``f`` and run the on-commit callbacks it registered (the sends), as a commit would."""

    def run(function: Callable[[], object]) -> object:
        with django_capture_on_commit_callbacks(execute=True):
            return function()

    return run


def queued() -> dict[str, list[int]]:
    from django_q.models import OrmQ

    found: dict[str, list[int]] = {}
    for message in OrmQ.objects.order_by("id"):
        found.setdefault(message.key, []).append(SignedPackage.loads(message.payload)["args"][0])
    return found


@pytest.mark.django_db
def test_purge_jobs_go_to_the_purge_queue_and_each_queue_has_its_own_window(jobs, settings, commit):
    from cleanup_ops.dispatch import dispatch_due_jobs

    settings.Q_PURGE_WORKERS = 1
    deletes, purges = jobs(JobKind.DELETE, 6), jobs(JobKind.PURGE, 5)
    assert commit(dispatch_due_jobs) == 4 + 2
    sent = queued()
    assert sent == {"retention": deletes[:4], "retention-purge": purges[:2]}
    # A full delete window does not hold the purge queue back, nor the other way round.
    assert commit(dispatch_due_jobs) == 0


@pytest.mark.django_db
def test_one_queue_when_purges_share_the_main_queue(jobs, settings, commit):
    from cleanup_ops.dispatch import dispatch_due_jobs

    settings.Q_PURGE_CLUSTER = "retention"
    deletes, purges = jobs(JobKind.DELETE, 1), jobs(JobKind.PURGE, 1)
    assert commit(dispatch_due_jobs) == 2
    assert sorted(queued()["retention"]) == sorted(deletes + purges)


@pytest.mark.django_db
def test_a_broker_that_cannot_be_reached_loses_nothing_the_next_call_sends_again(jobs, monkeypatch, commit):
    from cleanup_ops import dispatch

    deletes = jobs(JobKind.DELETE, 3)
    real_enqueue = dispatch._enqueue
    calls = {"n": 0}

    def flaky(queue: str, job_id: int) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise ConnectionError("broker down")
        real_enqueue(queue, job_id)

    monkeypatch.setattr(dispatch, "_enqueue", flaky)
    assert commit(dispatch.dispatch_due_jobs) == 3  # claimed; the second send fails after commit
    assert queued() == {"retention": [deletes[0]]}
    marked = dict(CleanupJob.objects.values_list("id", "enqueued_at"))
    assert marked[deletes[0]] is not None and marked[deletes[1]] is None and marked[deletes[2]] is None
    monkeypatch.setattr(dispatch, "_enqueue", real_enqueue)
    assert commit(dispatch.dispatch_due_jobs) == 2  # no lease-long wait for messages that never left
    assert sorted(queued()["retention"]) == sorted(deletes)


@pytest.mark.django_db
def test_no_hint_beyond_what_the_broker_can_hold_back_the_dispatcher_sends_it_when_due(jobs, monkeypatch, commit):
    from cleanup_ops import dispatch

    job_id = jobs(JobKind.DELETE, 1)[0]
    monkeypatch.setattr(dispatch, "broker_max_delay_seconds", lambda: 900.0)  # SQS's DelaySeconds limit
    commit(lambda: dispatch.hint_due_at(job_ids=[job_id], at=timezone.now() + timedelta(seconds=901)))
    assert queued() == {}
    assert CleanupJob.objects.get(pk=job_id).enqueued_at is None  # free for the dispatcher once due
    soon = timezone.now() + timedelta(seconds=899)
    commit(lambda: dispatch.hint_due_at(job_ids=[job_id], at=soon))
    assert queued() == {"retention": [job_id]}
    assert CleanupJob.objects.get(pk=job_id).enqueued_at == soon


@pytest.mark.django_db
def test_the_console_workers_page_shows_each_queue_through_the_broker_interface(jobs, client, commit):
    from cleanup_ops.dispatch import dispatch_due_jobs

    jobs(JobKind.DELETE, 3)
    commit(dispatch_due_jobs)
    client.force_login(make_user("op", "operator"))
    page = client.get("/console/workers/")
    assert page.status_code == 200
    assert page.context["broker"]["queues"]["retention"] == {"kinds": ["delete"], "window": 4, "waiting": 3}
    html = page.content.decode()
    assert 'data-testid="queue-retention"' in html and 'data-testid="queue-retention-purge"' in html


def test_the_cluster_status_is_written_at_most_every_two_seconds_on_sqs_and_rabbitmq(monkeypatch):
    written: list[tuple[str, int]] = []

    class Store:
        def set_stat(self, key: str, value: str, timeout: int) -> None:
            written.append((key, timeout))

    class Throttled(brokers.ThrottledStatus, Store):
        pass

    clock = iter([100.0, 100.5, 101.0, 102.1, 102.2])
    monkeypatch.setattr(brokers.time, "monotonic", lambda: next(clock))
    store = Throttled()
    for _ in range(4):
        store.set_stat("django_q:stat:a", "…", 3)  # every guard cycle, 0.5 s
    store.set_stat("django_q:stat:b", "…", 3)  # another cluster is not held back
    assert written == [("django_q:stat:a", 5), ("django_q:stat:a", 5), ("django_q:stat:b", 5)]
    assert issubclass(brokers.EndpointSqs, brokers.ThrottledStatus)
    assert issubclass(brokers.RabbitMQ, brokers.ThrottledStatus)


def _child_uses_its_own_connection(broker: object, parent_connection_id: int, out: object) -> None:
    broker.enqueue(signed(11))  # type: ignore[attr-defined]
    out.put((id(broker.connection) != parent_connection_id, broker.queue_size()))  # type: ignore[attr-defined]


@BROKERS
@pytest.mark.parametrize("broker_env", ["rabbitmq", "sqs"], indirect=True)  # Redis's client is fork-safe itself
@pytest.mark.django_db(transaction=True)
def test_a_forked_process_opens_its_own_connection_and_the_parents_keeps_working(broker_of, broker_env):
    """django-q2 forks its pusher and monitor with the sentinel's broker object."""
    import multiprocessing

    broker = broker_of("retention-test")
    broker.queue_size()
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_child_uses_its_own_connection, args=(broker, id(broker.connection), out))
    child.start()
    own, size = out.get(timeout=30)
    child.join(timeout=30)
    assert child.exitcode == 0
    assert own, "the child used the connection it inherited"
    assert size == 1
    broker.enqueue(signed(12))  # the parent's connection was neither used nor closed by the child
    assert broker.queue_size() == 2
