"""What operators of other job consoles look for (issue 39, item 7, from
item 8): the active holds on the portfolio and job pages, page size and the
sorts, filter tokens, CSV exports of the lists, quiet and drain of a worker
cluster with run-time limits, charts by portfolio and state, and the
"how to verify" panel beside a proof."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, Sweep
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property
from retention.services import legal_hold_place

from .conftest import make_records, make_user, utc

pytestmark = pytest.mark.django_db

OLD = utc("2020-01-01T00:00:00Z")
REASON = "litigation: tenancy dispute 2026-114"


def rejected(job_id: int) -> None:
    raise DownstreamError(400)


@pytest.fixture
def world(portfolio, active_policy, reviewer, time_machine):  # type: ignore[no-untyped-def]
    """Acme: two properties (leases; A1 also maintenance records); Birch: one
    property. The first Acme job is dead-lettered (HTTP 400)."""
    time_machine.move_to("2026-08-21T02:05:00Z", tick=False)
    birch = Portfolio.objects.create(name="Birch Estates", slug="birch")
    active_policy(portfolio, "lease", 365)
    active_policy(portfolio, "maintenance_record", 365)
    active_policy(birch, "lease", 365)
    a0 = Property.objects.create(portfolio=portfolio, name="Quay Court")
    a1 = Property.objects.create(portfolio=portfolio, name="Mill Lane")
    b0 = Property.objects.create(portfolio=birch, name="Birch Row")
    make_records(a0, "lease", 2, ended=OLD)
    make_records(a1, "lease", 2, ended=OLD)
    make_records(a1, "maintenance_record", 2, ended=OLD)
    make_records(b0, "lease", 2, ended=OLD)
    sweep_trigger()
    jobs = {(j.property_id, j.record_kind): j for j in CleanupJob.objects.order_by("id")}
    job_run_slice(job_id=jobs[(a0.pk, "lease")].pk, before_batch=rejected)
    return {
        "acme": portfolio,
        "birch": birch,
        "a0": a0,
        "a1": a1,
        "b0": b0,
        "jobs": jobs,
        "sweep": Sweep.objects.get(),
        "reviewer": reviewer,
    }


@pytest.fixture
def op(operator_user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(operator_user)
    return client


def hold(world, **scope):  # type: ignore[no-untyped-def]
    portfolio = scope.pop("portfolio", world["acme"])
    return legal_hold_place(portfolio=portfolio, placed_by=world["reviewer"], reason=REASON, **scope)


# --- 1. Holds on the portfolio and job pages -------------------------------------


def test_the_portfolio_page_lists_every_active_hold_in_the_portfolio_and_no_released_or_other_one(world, op):
    whole = hold(world)
    narrow = hold(world, property=world["a1"], record_kind="maintenance_record")
    released = hold(world, property=world["a0"])
    from retention.services import legal_hold_release

    legal_hold_release(hold_id=released.pk, released_by=world["reviewer"], reason="dispute settled out of court")
    elsewhere = hold(world, portfolio=world["birch"])
    html = op.get(f"/console/portfolios/{world['acme'].pk}/").content.decode()
    assert 'data-testid="holds"' in html
    assert f'data-testid="hold-{whole.pk}"' in html and f'data-testid="hold-{narrow.pk}"' in html
    assert f'data-testid="hold-{released.pk}"' not in html and f'data-testid="hold-{elsewhere.pk}"' not in html
    assert "2 active holds" in html and "Mill Lane" in html and REASON in html


def test_the_job_page_lists_the_holds_covering_its_partition_only(world, op):
    job = world["jobs"][(world["a1"].pk, "lease")]
    whole = hold(world)
    its_property = hold(world, property=world["a1"])
    its_kind = hold(world, record_kind="lease")
    other_property = hold(world, property=world["a0"])
    other_kind = hold(world, property=world["a1"], record_kind="maintenance_record")
    html = op.get(f"/console/jobs/{job.pk}/").content.decode()
    for shown in (whole, its_property, its_kind):
        assert f'data-testid="hold-{shown.pk}"' in html
    for hidden in (other_property, other_kind):
        assert f'data-testid="hold-{hidden.pk}"' not in html
    assert "3 active holds" in html


def test_a_job_that_no_hold_covers_says_so(world, op):
    job = world["jobs"][(world["b0"].pk, "lease")]
    hold(world)  # Acme's, not Birch's
    html = op.get(f"/console/jobs/{job.pk}/").content.decode()
    assert 'data-testid="no-holds"' in html


def test_the_holds_cost_a_bounded_number_of_queries_however_many_there_are(world, op, django_assert_max_num_queries):
    for n in range(30):
        hold(world, property=world["a0"] if n % 2 else world["a1"])
    with django_assert_max_num_queries(40):
        response = op.get(f"/console/portfolios/{world['acme'].pk}/")
    html = response.content.decode()
    assert "30 active holds" in html and "and 10 older holds" in html
    assert html.count('data-testid="hold-') == 20


def test_a_customer_sees_the_holds_of_their_own_portfolio_only(world):
    from retention.services import membership_grant

    customer = make_user("birch-auditor")
    membership_grant(user=customer, portfolio=world["birch"], role="auditor", granted_by=None)
    theirs = hold(world, portfolio=world["birch"])
    hold(world)
    client = Client()
    client.force_login(customer)
    job = world["jobs"][(world["b0"].pk, "lease")]
    html = client.get(f"/console/jobs/{job.pk}/").content.decode()
    assert f'data-testid="hold-{theirs.pk}"' in html and "1 active hold:" in html
    # The hold's link opens its page for this reader (never a link to a 403).
    assert f'href="/admin/retention/legalhold/{theirs.pk}/change/"' in html
    assert client.get(f"/admin/retention/legalhold/{theirs.pk}/change/").status_code == 200


# --- 2. Page size and the sorts --------------------------------------------------


def ids_in(html: str, prefix: str) -> list[int]:
    import re

    return [int(n) for n in re.findall(rf'data-testid="{prefix}-(\d+)"', html)]


@pytest.fixture
def letters(world):  # type: ignore[no-untyped-def]
    """Every job dead-lettered; their HTTP statuses none, 503, 400 and 404."""
    for job in world["jobs"].values():
        if job.state == "pending":
            job_run_slice(job_id=job.pk, before_batch=rejected)
    ordered = list(DeadLetter.objects.order_by("id"))
    for letter, status in zip(ordered, [None, 503, 400, 404], strict=True):
        DeadLetter.objects.filter(pk=letter.pk).update(http_status=status)
    return ordered


def test_per_page_sets_how_many_jobs_a_page_shows_and_the_next_page_keeps_it(world, op):
    html = op.get("/console/jobs/", {"per_page": 2}).content.decode()
    assert len(ids_in(html, "job")) == 2
    assert "Jobs 1 to 2 of 4" in html and "per_page=2" in html
    after = ids_in(html, "job")[-1]
    html = op.get("/console/jobs/", {"per_page": 2, "after": after}).content.decode()
    assert len(ids_in(html, "job")) == 2 and "Jobs 3 to 4 of 4" in html


@pytest.mark.parametrize("path", ["/console/jobs/", "/console/dead-letters/", "/console/sweeps/"])
@pytest.mark.parametrize("value", ["0", "201", "ten", "-5", "٣"])
def test_a_page_size_out_of_bounds_is_a_400_naming_per_page(world, op, path, value):
    response = op.get(path, {"per_page": value})
    assert response.status_code == 400
    html = response.content.decode()
    assert 'data-field="per_page"' in html and "from 1 to 200" in html


def test_jobs_sort_by_portfolio_property_and_sweep(world, op):
    jobs = list(CleanupJob.objects.all())
    by_portfolio = sorted(jobs, key=lambda j: (j.portfolio_id, j.pk))
    html = op.get("/console/jobs/", {"sort": "portfolio"}).content.decode()
    assert ids_in(html, "job") == [j.pk for j in by_portfolio]
    by_property = sorted(jobs, key=lambda j: (-(j.property_id or 0), -j.pk))
    html = op.get("/console/jobs/", {"sort": "-property"}).content.decode()
    assert ids_in(html, "job") == [j.pk for j in by_property]
    assert op.get("/console/jobs/", {"sort": "sweep"}).status_code == 200
    assert 'data-sort="portfolio"' in html and 'data-sort="property"' in html and 'data-sort="sweep"' in html


def test_dead_letters_sort_by_http_status_with_none_first_and_page_on_from_a_row(world, letters, op):
    statuses = dict(DeadLetter.objects.values_list("pk", "http_status"))
    by_status = sorted(letters, key=lambda d: (statuses[d.pk] or 0, d.pk))
    expected = [d.pk for d in by_status]
    html = op.get("/console/dead-letters/", {"sort": "http_status", "per_page": 2}).content.decode()
    first = ids_in(html, "letter")
    assert first == expected[:2]
    html = op.get("/console/dead-letters/", {"sort": "http_status", "per_page": 2, "after": first[-1]}).content.decode()
    assert ids_in(html, "letter") == expected[2:]
    assert 'data-sort="http_status"' in html


def test_an_unknown_sort_names_the_columns_it_could_have_been(world, op):
    response = op.get("/console/sweeps/", {"sort": "colour"})
    assert response.status_code == 400
    assert 'data-field="sort"' in response.content.decode() and "slot" in response.content.decode()


def test_sweeps_page_by_per_page_and_sort_by_jobs(world, op, operator_user, time_machine):
    time_machine.move_to("2026-08-22T02:05:00Z", tick=False)
    op.force_login(operator_user)  # a day later: the idle timeout logged the session out
    sweep_trigger()
    newest = Sweep.objects.order_by("-slot").first()
    html = op.get("/console/sweeps/", {"per_page": 1}).content.decode()
    assert ids_in(html, "sweep") == [newest.pk] and "Sweeps 1 to 1 of 2" in html
    html = op.get("/console/sweeps/", {"per_page": 1, "after": newest.pk}).content.decode()
    assert ids_in(html, "sweep") == [world["sweep"].pk]
    by_jobs = sorted(Sweep.objects.all(), key=lambda s: (s.jobs_admitted, s.pk))
    html = op.get("/console/sweeps/", {"sort": "jobs"}).content.decode()
    assert ids_in(html, "sweep") == [s.pk for s in by_jobs] and 'data-sort="jobs"' in html


def test_a_long_page_of_jobs_costs_the_same_queries_as_a_short_one(world, op, django_assert_max_num_queries):
    with django_assert_max_num_queries(30) as short:
        op.get("/console/jobs/", {"per_page": 1})
    with django_assert_max_num_queries(len(short.captured_queries)):
        op.get("/console/jobs/", {"per_page": 200})


# --- 3. Filter tokens ----------------------------------------------------------------


def tokens_in(html: str) -> dict[str, tuple[str, str]]:
    """name → (text, href) of each filter token."""
    import re
    from html import unescape

    found = re.findall(r'<a href="([^"]*)" data-token="([^"]+)"[^>]*>([^<]*)<', html)
    return {name: (unescape(text).strip(), unescape(href)) for href, name, text in found}


def test_each_active_filter_of_the_jobs_list_is_a_token_that_drops_only_itself(world, op):
    from urllib.parse import parse_qs

    acme = world["acme"]
    params = {"portfolio": acme.pk, "kind": "lease", "state": "pending", "sort": "portfolio", "per_page": 5}
    html = op.get("/console/jobs/", params).content.decode()
    tokens = tokens_in(html)
    assert set(tokens) == {"portfolio", "kind", "state"}
    assert tokens["portfolio"][0] == "portfolio: Acme Lettings"
    assert tokens["kind"][0] == "kind: Lease" and tokens["state"][0] == "state: Pending"
    left = parse_qs(tokens["portfolio"][1].removeprefix("?"))
    assert left == {"kind": ["lease"], "state": ["pending"], "sort": ["portfolio"], "per_page": ["5"]}
    # Following a token drops that filter: Birch's job is listed again.
    html = op.get("/console/jobs/" + tokens["portfolio"][1]).content.decode()
    birch_job = world["jobs"][(world["b0"].pk, "lease")]
    assert f'data-testid="job-{birch_job.pk}"' in html and "portfolio" not in tokens_in(html)


def test_the_inbox_status_token_removes_to_every_status_not_back_to_open(world, letters, op):
    DeadLetter.objects.filter(pk=letters[1].pk).update(status=DeadLetter.Status.DISMISSED)  # its status: 503
    html = op.get("/console/dead-letters/", {"http_status": 503}).content.decode()
    assert f'data-testid="letter-{letters[1].pk}"' not in html
    tokens = tokens_in(html)
    assert tokens["status"][0] == "status: Open" and tokens["http_status"][0] == "HTTP status: 503"
    html = op.get("/console/dead-letters/" + tokens["status"][1]).content.decode()
    assert "status" not in tokens_in(html)
    assert f'data-testid="letter-{letters[1].pk}"' in html  # dismissed, shown: every status


def test_a_list_without_filters_shows_no_tokens(world, op):
    assert 'data-testid="filter-tokens"' not in op.get("/console/jobs/", {"sort": "state"}).content.decode()


# --- 4. CSV exports of the lists -------------------------------------------------


def csv_of(response) -> list[dict[str, str]]:  # type: ignore[no-untyped-def]
    import csv
    import io

    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert response.streaming
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


def test_the_jobs_export_has_every_row_the_filter_matches_in_the_lists_sort_not_one_page(world, op):
    acme = world["acme"]
    rows = csv_of(op.get("/console/jobs/export.csv", {"portfolio": acme.pk, "sort": "property", "per_page": 1}))
    expected = sorted(CleanupJob.objects.filter(portfolio_id=acme.pk), key=lambda j: (j.property_id or 0, j.pk))
    assert [int(r["job_id"]) for r in rows] == [j.pk for j in expected]
    dead = next(r for r in rows if r["state"] == "dead")
    assert dead["last_failure_category"] == "downstream_rejected" and dead["created_at"].endswith("Z")
    assert set(rows[0]) >= {"job_id", "portfolio_id", "property_id", "record_kind", "state", "rows_deleted"}


def test_the_exports_carry_no_record_contents_error_text_or_reason(world, letters, op):
    from cleanup_ops.console_selectors.exports import JOB_EXPORT_COLUMNS, LETTER_EXPORT_COLUMNS

    for column in [*JOB_EXPORT_COLUMNS.values(), *LETTER_EXPORT_COLUMNS.values()]:
        assert not any(word in column for word in ("reason", "message", "error_class", "key", "cursor", "lease")) or (
            column == "sweep__key"
        ), column
    DeadLetter.objects.update(resolution_reason="tenant Jane Doe's lease, flat 4")
    body = b"".join(op.get("/console/dead-letters/export.csv", {"status": ""}).streaming_content).decode()
    assert "Jane Doe" not in body and body.count("\n") == 1 + len(letters)


def test_the_dead_letters_export_keeps_the_inbox_filter_and_search(world, letters, op):
    rows = csv_of(op.get("/console/dead-letters/export.csv", {"http_status": 404}))
    assert [int(r["letter_id"]) for r in rows] == [letters[3].pk] and rows[0]["http_status"] == "404"
    assert csv_of(op.get("/console/dead-letters/export.csv", {"q": "Birch Estates"})) == [
        r for r in csv_of(op.get("/console/dead-letters/export.csv", {"portfolio": world["birch"].pk}))
    ]


def test_a_customer_exports_only_their_own_portfolios_rows(world, letters):
    from retention.services import membership_grant

    customer = make_user("birch-auditor")
    membership_grant(user=customer, portfolio=world["birch"], role="auditor", granted_by=None)
    client = Client()
    client.force_login(customer)
    jobs = csv_of(client.get("/console/jobs/export.csv"))
    assert {r["portfolio_id"] for r in jobs} == {str(world["birch"].pk)} and len(jobs) == 1
    found = csv_of(client.get("/console/dead-letters/export.csv", {"portfolio": world["acme"].pk}))
    assert found == []


def test_an_export_is_refused_to_a_role_the_page_refuses_and_a_bad_filter_is_a_400(world, op, manager):
    client = Client()
    client.force_login(manager)
    assert client.get("/console/jobs/export.csv").status_code == 403
    assert client.get("/console/dead-letters/export.csv").status_code == 403
    bad = op.get("/console/jobs/export.csv", {"sort": "colour"})
    assert bad.status_code == 400 and 'data-field="sort"' in bad.content.decode()


def test_the_list_pages_link_to_their_export_with_the_same_filter(world, op):
    html = op.get("/console/jobs/", {"state": "dead", "sort": "portfolio"}).content.decode()
    assert 'href="/console/jobs/export.csv?state=dead&amp;sort=portfolio"' in html


def test_an_export_reads_in_a_fixed_number_of_queries(world, letters, op, django_assert_max_num_queries):
    with django_assert_max_num_queries(12):
        csv_of(op.get("/console/jobs/export.csv"))
    with django_assert_max_num_queries(12):
        csv_of(op.get("/console/dead-letters/export.csv", {"status": ""}))


# --- Plurals: "2 jobs", never "2 job(s)" -------------------------------------------


def test_no_template_or_message_of_the_product_writes_a_parenthesised_plural():
    """Every "(s)" and "(es)" in the apps' templates and Python sources (the
    console's messages, the verifiers' summaries, the system checks): a
    number's noun agrees with it (``pluralize``, ``ngettext``, ``counted``)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    pattern = re.compile(r"[A-Za-z]\((?:e?s)\)")
    found = [
        f"{path.relative_to(root)}:{n}: {line.strip()[:100]}"
        for app in ("cleanup_ops", "retention")
        for path in sorted((root / app).rglob("*"))
        if path.suffix in {".py", ".html", ".txt"}
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line.replace("http(s)", "https"))
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(("count", "expected"), [(1, "1 job matches"), (2, "2 jobs match"), (0, "0 jobs match")])
def test_the_jobs_count_agrees_with_its_number(world, op, count, expected):
    job_ids = [j.pk for j in CleanupJob.objects.order_by("id")][:count] or [10**9]
    html = op.get("/console/jobs/", {"id_min": min(job_ids), "id_max": max(job_ids)}).content.decode()
    assert f">{expected}" in html.replace('data-testid="jobs-count">', ">")


# --- 6. Charts by portfolio and state, and the verify panel -----------------------


def test_the_overview_charts_the_current_sweeps_jobs_by_state_and_by_portfolio(world, op):
    html = op.get("/console/").content.decode()
    assert 'aria-label="jobs of the current sweep by state"' in html
    assert 'aria-label="jobs of the current sweep by portfolio"' in html
    # Acme: 3 jobs (1 dead, 2 pending); Birch: 1 pending; the bars say so.
    assert "<title>Acme Lettings: 3</title>" in html and "<title>Birch Estates: 1</title>" in html
    assert "<title>Dead: 1</title>" in html and "<title>Pending: 3</title>" in html
    acme_row = html.split(f'data-testid="by-portfolio-{world["acme"].pk}"')[1].split("</tr>")[0]
    assert f"portfolio={world['acme'].pk}&amp;state=dead" in acme_row


def test_a_customer_charts_only_their_own_portfolios(world):
    from retention.services import membership_grant

    customer = make_user("birch-auditor")
    membership_grant(user=customer, portfolio=world["birch"], role="auditor", granted_by=None)
    client = Client()
    client.force_login(customer)
    html = client.get("/console/").content.decode()
    assert "<title>Birch Estates: 1</title>" in html and "Acme Lettings" not in html
    assert "<title>Pending: 1</title>" in html and "<title>Dead: 0</title>" in html


def test_the_breakdown_is_one_query_whatever_the_number_of_portfolios(world, django_assert_num_queries):
    from cleanup_ops.console_selectors.breakdown import PORTFOLIOS_CHARTED, jobs_by_portfolio_and_state

    for n in range(PORTFOLIOS_CHARTED + 3):
        CleanupJob.objects.create(
            sweep=world["sweep"],
            key=f"extra-{n}",
            portfolio_id=10_000 + n,
            record_kind="lease",
            policy_version=CleanupJob.objects.first().policy_version,
            cutoff=OLD,
            available_at=OLD,
        )
    with django_assert_num_queries(1):
        found = jobs_by_portfolio_and_state(sweep_id=world["sweep"].pk, portfolio_ids=None)
    assert len(found.portfolios) == PORTFOLIOS_CHARTED and found.portfolios_left_out == 5
    assert found.portfolios[0].portfolio_id == world["acme"].pk  # the most jobs first


def test_the_sweep_page_says_how_to_verify_its_proof_with_the_file_and_the_public_key(world, op):
    html = op.get(f"/console/sweeps/{world['sweep'].pk}/").content.decode()
    panel = html.split('data-testid="verify-panel"')[1].split("</section>")[0]
    name = "proof-" + world["sweep"].key.replace(":", "_")
    assert f"python proof_verify.py --public-key proof-keys.json {name}.json" in panel
    assert 'href="/api/v1/proof-keys/"' in panel and "cleanup_ledger_verify" in panel
    download = op.get(f"/console/sweeps/{world['sweep'].pk}/proof.json")
    assert download.status_code in {200, 503}
    if download.status_code == 200:
        assert f'filename="{name}.json"' in download["Content-Disposition"]


# --- 5. Quiet and drain of a worker cluster ------------------------------------------


@pytest.fixture
def this_cluster(settings):  # type: ignore[no-untyped-def]
    """The heartbeat of the cluster this test process is a worker of (its
    host, its cluster name, its parent as the sentinel)."""
    import os
    import socket

    from django.utils import timezone

    from cleanup_ops.models import WorkerHeartbeat

    now = timezone.now()
    return WorkerHeartbeat.objects.create(
        host=socket.gethostname(),
        cluster=settings.CLEANUP_CLUSTER_NAME,
        pid=os.getppid(),
        started_at=now,
        updated_at=now,
    )


CLUSTER_REASON = "store maintenance window, 22:00 to 23:00"


def control(client, hb, operation, reason=CLUSTER_REASON):  # type: ignore[no-untyped-def]
    return client.post(
        "/console/workers/control/",
        {"cluster": f"{hb.cluster}@{hb.host}", "operation": operation, "reason": reason},
        follow=True,
    )


def test_an_operator_quiets_a_cluster_with_a_reason_and_its_workers_lease_nothing_new(world, op, this_cluster):
    from cleanup_ops.models import ClusterControl
    from cleanup_ops.tasks import run_job
    from retention.models import AuditEvent

    page = control(op, this_cluster, "quiet").content.decode()
    assert "is quiet: it takes no new work" in page
    assert 'data-mode="quiet"' in op.get("/console/workers/").content.decode()
    event = AuditEvent.objects.get(action="cluster.quieted")
    assert event.object_id == f"{this_cluster.cluster}@{this_cluster.host}" and "store maintenance" in event.reason
    assert event.details == {"pid": this_cluster.pid, "from": "running", "to": "quiet"}
    audit = op.get("/console/audit/", {"action": "cluster"})
    assert audit.status_code == 200 and "cluster.quieted" in audit.content.decode()
    job = world["jobs"][(world["a1"].pk, "lease")]
    assert run_job(job.pk)["quiet"] is True
    job.refresh_from_db()
    assert job.state == "pending" and job.leases == 0 and job.rows_deleted == 0
    control(op, this_cluster, "resume")
    assert ClusterControl.objects.get().mode == "running"
    assert run_job(job.pk).get("quiet") is None
    job.refresh_from_db()
    assert job.state == "done" and job.rows_deleted == 2


def test_a_draining_cluster_stops_only_once_its_leases_are_done_and_is_told_once(world, op, this_cluster, monkeypatch):
    from django.utils import timezone

    from cleanup_ops import fleet
    from retention.models import AuditEvent

    stopped: list[int] = []
    monkeypatch.setattr(fleet, "_sigterm", stopped.append)
    control(op, this_cluster, "drain")
    job = world["jobs"][(world["a1"].pk, "lease")]
    CleanupJob.objects.filter(pk=job.pk).update(
        state="leased", lease_owner=f"{this_cluster.host}:4242", lease_expires_at=timezone.now() + timedelta(minutes=5)
    )
    assert fleet.cluster_takes_work() is False and stopped == []  # its slice is still running
    CleanupJob.objects.filter(pk=job.pk).update(state="pending", lease_owner="", lease_expires_at=None)
    assert fleet.cluster_takes_work() is False and stopped == [this_cluster.pid]
    assert fleet.cluster_takes_work() is False and stopped == [this_cluster.pid]  # once
    assert AuditEvent.objects.filter(action="cluster.drained").count() == 1
    assert "told to stop" in op.get("/console/workers/").content.decode()


def test_a_restarted_cluster_takes_work_whatever_its_last_run_was_told(world, op, this_cluster):
    from cleanup_ops import fleet
    from cleanup_ops.models import WorkerHeartbeat

    control(op, this_cluster, "quiet")
    assert fleet.cluster_takes_work() is False
    WorkerHeartbeat.objects.filter(pk=this_cluster.pk).update(pid=this_cluster.pid + 1)
    assert fleet.cluster_mode(host=this_cluster.host, cluster=this_cluster.cluster, pid=this_cluster.pid + 1) == (
        "running"
    )
    assert 'data-mode="running"' in op.get("/console/workers/").content.decode()


def test_a_cluster_decision_needs_a_reason_a_known_cluster_and_the_operators_role(world, op, this_cluster, auditor):
    from cleanup_ops.models import ClusterControl
    from retention.models import AuditEvent

    short = control(op, this_cluster, "quiet", reason="because").content.decode()
    assert "10" in short and not ClusterControl.objects.exists()
    ten_invisible = "\U0001d159" * 10
    control(op, this_cluster, "quiet", reason=ten_invisible)
    assert not ClusterControl.objects.exists()
    missing = op.post("/console/workers/control/", {"cluster": "ghost@nowhere", "operation": "quiet", "reason": REASON})
    assert missing.status_code == 302 and not ClusterControl.objects.exists()
    assert "nothing to resume" in control(op, this_cluster, "resume").content.decode()
    bad = op.post("/console/workers/control/", {"cluster": "x@y", "operation": "stop", "reason": REASON})
    assert bad.status_code == 400 and 'data-field="operation"' in bad.content.decode()
    client = Client()
    client.force_login(auditor)
    assert control(client, this_cluster, "quiet").status_code == 403
    assert 'data-testid="cluster-control"' not in client.get("/console/workers/").content.decode()
    assert not AuditEvent.objects.filter(action__startswith="cluster.").exists()


# --- 5. Run-time limits: the rate limits and the lease cap ---------------------------


def change_limit(client, name, value, reason=CLUSTER_REASON):  # type: ignore[no-untyped-def]
    return client.post("/console/workers/limits/", {"limit": name, "value": value, "reason": reason}, follow=True)


def test_an_operator_raises_the_lease_cap_at_run_time_and_the_next_lease_uses_it(world, op, settings):
    from cleanup_ops.execution.leases import job_lease
    from retention.models import AuditEvent

    settings.CLEANUP_PORTFOLIO_MAX_LEASES = 1
    a0, a1 = (world["jobs"][(world[p].pk, "lease")] for p in ("a0", "a1"))
    CleanupJob.objects.filter(pk=a0.pk).update(state="pending", available_at=OLD)  # the dead one, due again
    assert job_lease(job_id=a0.pk, owner="host:1") is not None
    assert job_lease(job_id=a1.pk, owner="host:2") is None  # Acme is at its cap of 1
    page = change_limit(op, "portfolio_max_leases", "2").content.decode()
    assert "now 2" in page
    assert job_lease(job_id=a1.pk, owner="host:2") is not None
    event = AuditEvent.objects.get(action="limits.changed")
    assert event.object_id == "portfolio_max_leases" and event.reason == CLUSTER_REASON
    assert event.details == {"from": 1.0, "to": 2.0, "setting": False}
    assert "limits.changed" in op.get("/console/audit/", {"action": "limits"}).content.decode()
    html = op.get("/console/workers/").content.decode()
    row = html.split('data-testid="limit-portfolio_max_leases"')[1].split("</tr>")[0]
    assert ">2<" in row and CLUSTER_REASON in row


def test_a_rate_limit_changed_at_run_time_is_the_buckets_rate_and_empty_puts_the_setting_back(world, op, settings):
    from cleanup_ops.ratelimit import buckets_for, effective_limits

    settings.CLEANUP_RATE_GLOBAL = 0.0
    assert buckets_for(world["acme"].pk) == []
    change_limit(op, "rate_global", "0.5")
    assert [b.rate for b in buckets_for(world["acme"].pk)] == [0.5]
    assert effective_limits()["global_rate_per_s"] == 0.5
    change_limit(op, "rate_global", "")
    assert buckets_for(world["acme"].pk) == [] and effective_limits()["global_rate_per_s"] == 0.0


def test_a_process_asks_the_cache_for_the_run_time_limits_once_a_period_and_again_at_once_after_a_change(
    world, op, settings, monkeypatch, time_machine
):
    """Every token reservation and lease asks for the run-time limits; on a shared
    cache (Redis, a database cache) each ask would be a round trip. The process
    keeps the cached entry until the entry itself expires."""
    from django.core.cache import cache

    from cleanup_ops import ratelimit

    settings.CLEANUP_PORTFOLIO_MAX_LEASES = 1
    asked: list[str] = []

    class Counted:
        def get(self, key: str) -> object:
            asked.append(key)
            return cache.get(key)

        def set(self, key: str, value: object, timeout: float) -> None:
            cache.set(key, value, timeout)

        def delete(self, key: str) -> None:
            cache.delete(key)

    monkeypatch.setattr(ratelimit, "cache", Counted())
    ratelimit.runtime_limits_forget()  # the world's slices read them already
    for _ in range(50):
        assert (ratelimit.portfolio_max_leases(), ratelimit.slice_seconds()) == (1, settings.CLEANUP_SLICE_SECONDS)
    assert len(asked) == 1
    change_limit(op, "portfolio_max_leases", "2")  # this process forgets its copy at once
    before = len(asked)
    for _ in range(50):
        assert ratelimit.portfolio_max_leases() == 2
    assert len(asked) == before + (0 if before > 1 else 1)  # the page after the change may have asked already
    settled = len(asked)
    time_machine.shift(ratelimit.RUNTIME_LIMITS_CACHE_SECONDS + 0.1)  # the entry expires, and the copy with it
    assert ratelimit.portfolio_max_leases() == 2
    assert len(asked) == settled + 1


@pytest.mark.parametrize(
    ("name", "value", "field"),
    [("lease_cap", "2", "limit"), ("portfolio_max_leases", "two", "value"), ("rate_global", "-1", "value")],
)
def test_a_malformed_limit_change_is_a_400_naming_the_field(world, op, name, value, field):
    response = op.post("/console/workers/limits/", {"limit": name, "value": value, "reason": CLUSTER_REASON})
    assert response.status_code == 400 and f'data-field="{field}"' in response.content.decode()


def test_a_limit_change_needs_a_reason_a_bound_and_the_operators_role(world, op, auditor):
    from cleanup_ops.models import RuntimeLimit

    assert "10" in change_limit(op, "portfolio_max_leases", "3", reason="faster").content.decode()
    assert "from 1 to 1000" in change_limit(op, "portfolio_max_leases", "0").content.decode()
    assert "whole number" in change_limit(op, "portfolio_max_leases", "2.5").content.decode()
    assert not RuntimeLimit.objects.exists()
    client = Client()
    client.force_login(auditor)
    assert change_limit(client, "portfolio_max_leases", "3").status_code == 403
    assert "Change it" not in client.get("/console/workers/").content.decode()
    assert not RuntimeLimit.objects.exists()


def test_an_operator_caps_a_jobs_run_time_per_turn_and_the_next_slice_stops_at_it(world, op, settings):
    import time

    from cleanup_ops.ratelimit import slice_seconds

    settings.CLEANUP_SLICE_SECONDS = 5.0
    settings.CLEANUP_SLICE_BATCHES = 100
    page = change_limit(op, "slice_seconds", "0.1").content.decode()
    assert "now 0.1" in page and slice_seconds() == 0.1

    def slow(job_id: int) -> None:
        time.sleep(0.15)

    job = world["jobs"][(world["a1"].pk, "lease")]
    capped = job_run_slice(job_id=job.pk, batch_size=1, before_batch=slow)
    assert capped.batches == 1 and capped.rows_deleted == 1  # the cap ended the turn after one batch
    change_limit(op, "slice_seconds", "")
    uncapped = job_run_slice(job_id=job.pk, batch_size=1, before_batch=slow)
    assert uncapped.rows_deleted == 1 and uncapped.batches >= 1  # the rest, in one turn


def test_the_run_time_cap_may_lower_the_slice_but_never_raise_it_past_the_setting(world, op, settings):
    from cleanup_ops.models import RuntimeLimit

    settings.CLEANUP_SLICE_SECONDS = 5.0
    assert "it may be lower, not higher" in change_limit(op, "slice_seconds", "30").content.decode()
    assert not RuntimeLimit.objects.exists()
