"""The console's pages for operators: sweeps and the drain forecast, jobs and
a job, a dead letter and "all matching", workers, pauses, portfolios, the
humanized figures, live fragments and the offline API docs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, PipelinePause, Sweep, WorkerHeartbeat
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.schedule import sweep_trigger
from properties.models import Portfolio, Property
from retention.models import AuditEvent

from .conftest import make_records, utc

pytestmark = pytest.mark.django_db

OLD = utc("2020-01-01T00:00:00Z")
REASON = "the store accepts these again"


def reject(job_id: int) -> None:
    raise DownstreamError(400)


@pytest.fixture
def world(portfolio, active_policy, time_machine):  # type: ignore[no-untyped-def]
    """Two portfolios; three partitions in Acme (two dead-lettered), one in Birch (done)."""
    time_machine.move_to("2026-08-21T02:05:00Z", tick=False)
    birch = Portfolio.objects.create(name="Birch Estates", slug="birch")
    active_policy(portfolio, "lease", 365)
    active_policy(birch, "lease", 365)
    for j in range(3):
        make_records(Property.objects.create(portfolio=portfolio, name=f"A{j}"), "lease", 2, ended=OLD)
    make_records(Property.objects.create(portfolio=birch, name="B0"), "lease", 2, ended=OLD)
    sweep_trigger()
    jobs = list(CleanupJob.objects.order_by("id"))
    for n, job in enumerate(jobs):
        job_run_slice(job_id=job.pk, before_batch=reject if n < 2 else None)
    return {"acme": portfolio, "birch": birch, "sweep": Sweep.objects.get(), "jobs": jobs}


@pytest.fixture
def op(operator_user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(operator_user)
    return client


def test_every_new_page_renders_for_an_operator(world, op):
    letter = DeadLetter.objects.order_by("id").first()
    pages = [
        "/console/",
        "/console/?hours=168",
        "/console/sweeps/",
        f"/console/sweeps/{world['sweep'].pk}/",
        "/console/jobs/",
        f"/console/jobs/?sweep={world['sweep'].pk}&state=dead&portfolio={world['acme'].pk}&kind=lease&category=downstream_rejected",
        f"/console/jobs/{world['jobs'][0].pk}/",
        "/console/dead-letters/",
        f"/console/dead-letters/{letter.pk}/",
        "/console/dead-letters/all-matching/?operation=redrive",
        "/console/workers/",
        "/console/pauses/",
        f"/console/portfolios/{world['acme'].pk}/",
        "/console/audit/",
    ]
    for path in pages:
        response = op.get(path)
        assert response.status_code == 200, path
        shows_names = not path.startswith(("/console/workers", "/console/audit", "/console/sweeps/"))
        assert b"Acme Lettings" in response.content or not shows_names, path


# --- Humanized durations and times ------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (27100.1, "7 h 31 min"),
        (200, "3 min 20 s"),
        (7200, "2 h"),
        (7212, "2 h"),  # adjacent units only: not "2 h 0 min 12 s"
        (93784, "1 d 2 h"),
        (0.4, "0.4 s"),
        (0, "0 s"),
        (59, "59 s"),
        (-90, "-1 min 30 s"),
        (None, "—"),
        (timedelta(minutes=3), "3 min"),
    ],
)
def test_durations_read_like_a_person_would_say_them(seconds, text):
    from cleanup_ops.templatetags.console import duration

    assert duration(seconds) == text


def test_times_are_relative_to_now(time_machine):
    from cleanup_ops.templatetags.console import ago, when

    time_machine.move_to("2026-08-21T10:00:00Z", tick=False)
    assert ago(utc("2026-08-21T09:57:00Z")) == "3 min ago"
    assert ago(utc("2026-08-21T02:29:00Z")) == "7 h 31 min ago"
    assert ago(utc("2026-08-21T10:40:00Z")) == "in 40 min"
    assert ago("2026-08-21T10:00:00+00:00") == "just now"
    assert ago(None) == "—"
    html = when(utc("2026-08-21T09:57:00Z"))
    assert 'datetime="2026-08-21T09:57:00+00:00"' in html and 'title="2026-08-21 09:57:00 UTC"' in html
    assert ">3 min ago</time>" in html


def test_labels_for_kinds_states_and_categories():
    from cleanup_ops.templatetags.console import label

    assert label("maintenance_record", "kind") == "Maintenance record"
    assert label("downstream_rejected", "category") == "Downstream rejected (4xx)"
    assert label("dead", "state") == "Dead"
    assert label("", "outcome") == "—"
    assert label("something_new", "kind") == "something_new"


# --- Charts ------------------------------------------------------------------------


def test_a_chart_has_round_numbered_axes_and_values():
    from cleanup_ops.charts import bar_chart, nice_ceiling

    assert [nice_ceiling(v) for v in (0, 3, 7, 12, 2400, 99_000)] == [1, 5, 10, 20, 2500, 100_000]
    chart = bar_chart([("01h", 0), ("02h", 1200), ("03h", 2400)], x_label="UTC", y_label="rows")
    assert chart["max"] == 2500
    assert [g["text"] for g in chart["grid"]] == ["0", "625", "1.25k", "1.88k", "2.5k"]
    assert [b["value_text"] for b in chart["bars"]] == ["0", "1.2k", "2.4k"]
    assert [b["show_value"] for b in chart["bars"]] == [False, True, True]
    assert chart["bars"][2]["h"] == pytest.approx(2 * chart["bars"][1]["h"], abs=0.2)
    many = bar_chart([(f"{h}h", h) for h in range(48)])
    assert sum(b["show_label"] for b in many["bars"]) <= 12  # thinned x labels
    assert bar_chart([])["empty"]


def test_the_overview_chart_takes_a_time_range(world, op):
    page = op.get("/console/?hours=48")
    assert page.context["hours"] == 48
    assert len(page.context["throughput_chart"]["bars"]) == 48
    week = op.get("/console/?hours=168")
    assert len(week.context["throughput_chart"]["bars"]) == 28  # 6-hour buckets
    assert "one bar per 6 hours" in week.content.decode()
    refused = op.get("/console/?hours=5")  # not a choice: a 400 naming the parameter
    assert refused.status_code == 400 and refused.context["field"] == "hours"


# --- Drain forecast ---------------------------------------------------------------


def forecast(**kwargs):  # type: ignore[no-untyped-def]
    from cleanup_ops.console_selectors import drain_forecast

    base = {
        "now": utc("2026-08-21T04:00:00Z"),
        "started_at": utc("2026-08-21T02:00:00Z"),
        "next_slot": utc("2026-08-22T02:00:00Z"),
    }
    return drain_forecast(**{**base, **kwargs})


def test_the_forecast_projects_the_finish_from_the_rate_of_the_last_minutes():
    f = forecast(remaining=300, finished_recently=150)  # 150 jobs in 15 min: 10/min
    assert f.status == "on_time" and not f.warning
    assert f.rate_per_minute == 10
    assert f.projected_finish == utc("2026-08-21T04:30:00Z")
    assert f.margin_seconds == (utc("2026-08-22T02:00:00Z") - utc("2026-08-21T04:30:00Z")).total_seconds()


def test_the_forecast_warns_when_the_work_will_not_finish_before_the_next_slot():
    f = forecast(remaining=30_000, finished_recently=15)  # 1/min: 500 h
    assert f.status == "late" and f.warning
    assert f.projected_finish > f.next_slot and f.margin_seconds < 0


def test_a_sweep_younger_than_the_window_is_measured_since_it_started():
    f = forecast(now=utc("2026-08-21T02:05:00Z"), remaining=100, finished_recently=50)
    assert f.window_seconds == 300 and f.rate_per_minute == 10


def test_no_progress_is_a_stall_and_too_short_a_window_is_still_measuring():
    assert forecast(remaining=5, finished_recently=0).status == "stalled"
    assert forecast(remaining=5, finished_recently=0).warning
    young = forecast(now=utc("2026-08-21T02:00:30Z"), remaining=5, finished_recently=1)
    assert young.status == "measuring" and not young.warning
    assert forecast(remaining=0, finished_recently=0).status == "done"
    overran = forecast(now=utc("2026-08-22T02:10:00Z"), remaining=5, finished_recently=0)
    assert overran.status == "overran" and overran.warning


def test_the_next_slot_comes_from_the_schedule(settings):
    from cleanup_ops.console_selectors import next_slot_after

    settings.CLEANUP_SCHEDULE = "0 2 * * *"
    assert next_slot_after(utc("2026-08-21T02:00:00Z")) == utc("2026-08-22T02:00:00Z")
    settings.CLEANUP_SCHEDULE = "30 */6 * * *"
    assert next_slot_after(utc("2026-08-21T06:30:00Z")) == utc("2026-08-21T12:30:00Z")


def test_the_sweep_forecast_counts_jobs_finished_in_the_window(world, time_machine):
    from cleanup_ops.console_selectors import sweep_forecast

    sweep = world["sweep"]
    # Two of four jobs are dead (no finish time), two finished at 02:05.
    time_machine.move_to("2026-08-21T02:10:00Z", tick=False)
    done = sweep_forecast(sweep, now=utc("2026-08-21T02:10:00Z"), portfolio_ids=None)
    assert (done.status, done.remaining) == ("done", 0)
    CleanupJob.objects.filter(pk=world["jobs"][0].pk).update(state="pending", attempt=0)
    f = sweep_forecast(sweep, now=utc("2026-08-21T02:10:00Z"), portfolio_ids=None)
    assert (f.remaining, f.finished_in_window) == (1, 2)
    assert f.status == "on_time"
    late = sweep_forecast(sweep, now=utc("2026-08-21T03:00:00Z"), portfolio_ids=None)
    assert late.status == "stalled" and late.warning  # nothing finished in the last 15 min


def test_the_overview_and_the_sweep_page_show_the_forecast_warning(world, op, time_machine):
    CleanupJob.objects.filter(pk=world["jobs"][0].pk).update(state="pending", attempt=0)
    Sweep.objects.filter(pk=world["sweep"].pk).update(status="running", finished_at=None)
    time_machine.move_to("2026-08-21T03:00:00Z", tick=False)
    # A cluster of the main queue reported a minute ago: the job could run, and nothing finishes.
    now = utc("2026-08-21T03:00:00Z")
    WorkerHeartbeat.objects.create(
        host="worker-1",
        cluster="default",
        pid=7,
        started_at=now - timedelta(hours=1),
        updated_at=now - timedelta(minutes=1),
    )
    for path in ("/console/", f"/console/sweeps/{world['sweep'].pk}/", "/console/sweeps/"):
        page = op.get(path).content.decode()
        assert 'data-testid="forecast" data-status="stalled"' in page, path
        assert "Will not finish before the next slot" in page, path


# --- Jobs ---------------------------------------------------------------------------


def test_the_job_filter_is_parsed_once_strictly_or_leniently():
    from cleanup_ops.console_selectors import JobFilter, job_filter_parse
    from retention.filters import FilterError

    params = {"sweep": "3", "state": "dead", "portfolio": "7", "kind": "lease", "category": "timeout"}
    parsed = job_filter_parse(params, strict=True)
    assert parsed == JobFilter(sweep_id=3, state="dead", portfolio_id=7, record_kind="lease", category="timeout")
    assert parsed.as_params() == params
    assert job_filter_parse({"state": "bogus", "sweep": "x"}, strict=False) == JobFilter()
    with pytest.raises(FilterError) as exc:
        job_filter_parse({"kind": "bogus"}, strict=True)
    assert exc.value.field == "kind"


def test_the_jobs_list_filters_and_pages_back_by_id(world, op):
    acme = world["acme"].pk
    dead = op.get(f"/console/jobs/?state=dead&portfolio={acme}")
    assert [j.pk for j in dead.context["result"].rows] == [world["jobs"][1].pk, world["jobs"][0].pk]
    assert dead.context["result"].count == 2
    assert "Downstream rejected (4xx)" in dead.content.decode()
    birch = op.get(f"/console/jobs/?portfolio={world['birch'].pk}")
    assert [j.pk for j in birch.context["result"].rows] == [world["jobs"][3].pk]
    assert op.get("/console/jobs/?category=timeout").context["result"].count == 0
    from cleanup_ops import console_selectors

    small = console_selectors.jobs_page(console_selectors.JobFilter(), portfolio_ids=None, size=3)
    assert small.older == small.jobs[-1].pk and small.count == 4
    rest = console_selectors.jobs_page(console_selectors.JobFilter(), portfolio_ids=None, size=3, before=small.older)
    assert [j.pk for j in rest.jobs] == [world["jobs"][0].pk] and rest.older is None


def test_the_job_page_shows_its_lease_ledger_letter_and_redrives(world, op, operator_user):
    from cleanup_ops.recovery.operator import dead_letter_redrive

    done = world["jobs"][2]
    page = op.get(f"/console/jobs/{done.pk}/")
    assert page.context["ledger_totals"]["n"] == 1 and page.context["ledger_totals"]["rows"] == 2
    assert page.context["letter"] is None
    dead = world["jobs"][0]
    letter = DeadLetter.objects.get(job=dead)
    new = dead_letter_redrive(letter_id=letter.pk, actor=operator_user, reason=REASON)
    CleanupJob.objects.filter(pk=new.pk).update(
        state="leased", lease_owner="worker-host:4242", lease_expires_at=utc("2026-08-21T02:06:00Z")
    )
    page = op.get(f"/console/jobs/{dead.pk}/")
    body = page.content.decode()
    assert page.context["letter"] == letter
    assert [j.pk for j in page.context["chain"]] == [dead.pk, new.pk]
    assert [j.pk for j in page.context["redrives"]] == [new.pk]
    assert f'href="/console/dead-letters/{letter.pk}/"' in body and f'href="/console/jobs/{new.pk}/"' in body
    assert REASON in body  # the decision's audit event
    leased = op.get(f"/console/jobs/{new.pk}/").content.decode()
    assert "worker-host:4242" in leased and ">in 1 min</time>" in leased


# --- Dead letters ---------------------------------------------------------------------


def test_the_dead_letter_page_links_its_job_sweep_portfolio_and_audit_events(world, op):
    letter = DeadLetter.objects.order_by("id").first()
    body = op.get(f"/console/dead-letters/{letter.pk}/").content.decode()
    assert f'href="/console/jobs/{letter.job_id}/"' in body
    assert f'href="/console/sweeps/{letter.sweep_id}/"' in body
    assert f'href="/console/portfolios/{letter.portfolio_id}/" class="portfolio">Acme Lettings</a>' in body
    assert "Downstream rejected (4xx)" in body and "No decision yet." in body
    done = op.post(
        "/console/dead-letters/action/",
        {
            "operation": "dismiss",
            "letter": letter.pk,
            "reason": REASON,
            "confirm": "yes",
            "next": f"/console/dead-letters/{letter.pk}/",
        },
    )
    assert done.status_code == 302 and done["Location"] == f"/console/dead-letters/{letter.pk}/"
    body = op.get(f"/console/dead-letters/{letter.pk}/").content.decode()
    event = AuditEvent.objects.get(action="dead_letter.dismissed")
    assert f'data-testid="letter-event-{event.pk}"' in body and REASON in body
    offsite = op.post(
        "/console/dead-letters/action/",
        {
            "operation": "dismiss",
            "letter": letter.pk,
            "reason": REASON,
            "confirm": "yes",
            "next": "https://evil.example/",
        },
    )
    assert offsite["Location"] == "/console/dead-letters/"


def test_redrive_all_matching_shows_the_count_asks_a_reason_and_decides_every_letter(world, op):
    letters = list(DeadLetter.objects.order_by("id"))
    assert len(letters) == 2
    query = f"operation=redrive&category=downstream_rejected&portfolio={world['acme'].pk}"
    page = op.get(f"/console/dead-letters/all-matching/?{query}")
    assert page.status_code == 200 and page.context["count"] == 2
    assert "Redrive all 2 open dead letters matching this filter?" in page.content.decode()
    form = {
        "operation": "redrive",
        "category": "downstream_rejected",
        "portfolio": world["acme"].pk,
        "expected": 2,
        "seen": page.context["seen"],
        "confirm": "yes",
    }
    short = op.post("/console/dead-letters/all-matching/", {**form, "reason": "too short"})
    assert short.status_code == 400 and "at least 10 characters" in short.content.decode()
    stale = op.post("/console/dead-letters/all-matching/", {**form, "expected": 3, "reason": REASON})
    assert stale.status_code == 400 and "changed from 3 to 2" in stale.content.decode()
    assert DeadLetter.objects.filter(status="open").count() == 2  # nothing happened yet
    done = op.post("/console/dead-letters/all-matching/", {**form, "reason": REASON}, follow=True)
    assert "Redrove 2 dead letters: see" in done.content.decode()
    assert "the 2 new jobs</a>" in done.content.decode()
    assert DeadLetter.objects.filter(status="redriven").count() == 2
    assert AuditEvent.objects.filter(action="dead_letter.redriven", reason=REASON).count() == 2


def test_the_inbox_offers_all_matching_only_to_those_who_may_decide(world, op, auditor):
    inbox = op.get("/console/dead-letters/").content.decode()
    assert "Redrive all 2 matching this filter" in inbox and "Dismiss all 2 matching this filter" in inbox
    client = Client()
    client.force_login(auditor)
    assert "matching this filter" not in client.get("/console/dead-letters/").content.decode()
    assert client.get("/console/dead-letters/all-matching/?operation=redrive").status_code == 403


# --- Pauses, portfolios, workers ---------------------------------------------------------


def test_pausing_picks_a_portfolio_by_name_and_resuming_needs_a_reason(world, op):
    page = op.get("/console/pauses/").content.decode()
    assert f'<option value="{world["birch"].pk}">Birch Estates (birch)</option>' in page
    paused = op.post(
        "/console/pause/",
        {"operation": "pause", "portfolio": world["birch"].pk, "reason": REASON, "next": "/console/pauses/"},
        follow=True,
    )
    assert "Paused Birch Estates." in paused.content.decode()
    assert f'data-testid="paused-{world["birch"].pk}"' in paused.content.decode()
    refused = op.post(
        "/console/pause/",
        {"operation": "resume", "portfolio": world["birch"].pk, "reason": "", "next": "/console/pauses/"},
        follow=True,
    )
    assert PipelinePause.objects.active().filter(portfolio_id=world["birch"].pk).exists()
    assert "reason" in refused.content.decode().lower()
    op.post("/console/pause/", {"operation": "resume", "portfolio": world["birch"].pk, "reason": REASON})
    assert not PipelinePause.objects.active().exists()
    history = op.get("/console/pauses/").content.decode()
    assert "No portfolio is paused." in history and "Birch Estates" in history


def test_the_portfolio_page_sums_up_its_pipeline(world, op):
    page = op.get(f"/console/portfolios/{world['acme'].pk}/")
    s = page.context["s"]
    assert s["letters_open"] == 2 and s["current_jobs"] == 3 and s["current_rows"] == 2
    assert "Not paused" in page.content.decode()
    assert op.get("/console/portfolios/999999/").status_code == 404


def test_the_workers_page_shows_clusters_and_leases_by_worker(world, op, time_machine):
    now = utc("2026-08-21T02:05:00Z")
    WorkerHeartbeat.objects.create(
        host="worker-1",
        cluster="default",
        pid=77,
        started_at=now - timedelta(hours=2),
        last_progress_at=now - timedelta(seconds=20),
        turns=12,
        jobs_leased=30,
        rows_deleted=900,
        updated_at=now,
    )
    CleanupJob.objects.filter(pk=world["jobs"][0].pk).update(
        state="leased", lease_owner="worker-1:1234", lease_expires_at=now + timedelta(seconds=30)
    )
    CleanupJob.objects.filter(pk=world["jobs"][1].pk).update(
        state="leased", lease_owner="worker-1:1235", lease_expires_at=now - timedelta(seconds=30)
    )
    page = op.get("/console/workers/")
    w, clusters = page.context["w"], page.context["clusters"]
    assert [c["state"] for c in clusters] == ["working"]
    assert clusters[0]["host_leases"] == {"jobs": 1, "holders": 0, "expired": 1}
    assert {o["lease_owner"]: (o["jobs"], o["expired"]) for o in w["owners"]} == {
        "worker-1:1234": (1, 0),
        "worker-1:1235": (0, 1),
    }
    body = page.content.decode()
    assert "2 h ago" in body and "20 s ago" in body


def test_a_cluster_without_progress_while_due_work_waits_is_shown_wedged(world, op, time_machine, settings):
    now = utc("2026-08-21T02:30:00Z")
    time_machine.move_to(now, tick=False)
    WorkerHeartbeat.objects.create(
        host="worker-1",
        cluster="default",
        pid=77,
        started_at=now - timedelta(hours=2),
        last_progress_at=now - timedelta(minutes=20),
        updated_at=now - timedelta(minutes=20),
    )
    CleanupJob.objects.filter(pk=world["jobs"][0].pk).update(state="pending", available_at=now - timedelta(minutes=10))
    clusters = op.get("/console/workers/").context["clusters"]
    assert clusters[0]["state"] == "wedged"


# --- Live refresh ---------------------------------------------------------------------


def test_a_live_page_answers_the_poller_with_its_fragment_only(world, op):
    full = op.get("/console/jobs/")
    assert b"<html" in full.content and b'id="live"' in full.content
    assert b'hx-trigger="every 5s, visibilitychange from:document"' in full.content
    fragment = op.get("/console/jobs/", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="live")
    body = fragment.content.decode()
    assert body.lstrip().startswith('<div id="live"') and "<html" not in body
    assert "Acme Lettings" in body
    assert "HX-Request" in fragment["Vary"]


# --- Tenant scope on the new pages ---------------------------------------------------------


def test_a_customer_sees_only_their_portfolio_on_the_new_pages(world):
    from retention.models import Membership
    from tests.conftest import make_user

    member = make_user("alder-auditor")
    Membership.objects.create(user=member, portfolio=world["birch"], role="auditor")
    client = Client()
    client.force_login(member)
    jobs = client.get("/console/jobs/")
    assert [j.pk for j in jobs.context["result"].rows] == [world["jobs"][3].pk]
    assert b"Acme Lettings" not in jobs.content
    assert client.get(f"/console/jobs/{world['jobs'][0].pk}/").status_code == 404
    assert client.get(f"/console/jobs/{world['jobs'][3].pk}/").status_code == 200
    letter = DeadLetter.objects.first()
    assert client.get(f"/console/dead-letters/{letter.pk}/").status_code == 404
    assert client.get(f"/console/portfolios/{world['acme'].pk}/").status_code == 404
    sweeps = client.get("/console/sweeps/")
    assert sweeps.context["rows"][0]["jobs"] == 1 and sweeps.context["rows"][0]["letters"] == 0
    assert client.get("/console/workers/").status_code == 403
    assert client.get("/console/pauses/").status_code == 403


# --- API docs offline ---------------------------------------------------------------------


def test_the_api_docs_are_served_from_static_files_not_a_cdn(op):
    for path in ("/api/v1/docs/", "/api/v1/redoc/"):
        page = op.get(path)
        assert page.status_code == 200, path
        body = page.content.decode()
        assert "/static/drf_spectacular_sidecar/" in body, path
        assert "cdn" not in body.lower() and "unpkg" not in body.lower(), path
    assert Client().get("/api/v1/docs/").status_code in {401, 403}


def test_the_overview_names_paused_portfolios_for_the_platforms_staff(world, op, operator_user):
    from cleanup_ops.recovery.operator import pipeline_pause

    pipeline_pause(actor=operator_user, reason=REASON, portfolio_id=world["birch"].pk)
    page = op.get("/console/")
    assert [p["portfolio_id"] for p in page.context["f"]["pauses"]] == [world["birch"].pk]
    body = page.content.decode()
    assert f'data-testid="portfolio-pause-{world["birch"].pk}"' in body and ">Birch Estates</a> paused" in body
