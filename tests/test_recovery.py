from __future__ import annotations

import json
import random
from datetime import timedelta
from email.utils import format_datetime
from io import StringIO

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from cleanup_ops.dispatch import fair_due_job_ids
from cleanup_ops.execution.batches import job_load, run_batch
from cleanup_ops.execution.leases import job_lease, job_release
from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, JobState, LedgerEntry, Sweep
from cleanup_ops.recovery.classification import (
    DownstreamError,
    DownstreamTimeout,
    FailureCategory,
    InvalidInput,
    backoff_delay,
    classify,
    parse_retry_after,
)
from cleanup_ops.recovery.operator import (
    DeadLetterNotOpen,
    dead_letter_dismiss,
    dead_letter_redrive,
    dead_letters_redrive_bulk,
    pipeline_pause,
    pipeline_resume,
)
from cleanup_ops.schedule import sweep_trigger
from cleanup_ops.selectors import DeadLetterFilter
from properties.models import Property
from retention.models import AuditEvent

from .conftest import make_records, remaining_ids, utc

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
OLD = utc("2020-01-01T00:00:00Z")
REASON = "store outage is over, retrying"

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock(time_machine):
    time_machine.move_to(NOW, tick=False)
    return time_machine


@pytest.fixture
def job(portfolio, prop, active_policy, clock) -> CleanupJob:
    active_policy(portfolio, "lease", 365)
    make_records(prop, "lease", 6, ended=OLD)
    sweep_trigger(slot=SLOT, now=NOW)
    return CleanupJob.objects.get()


def raising(exc: BaseException):  # type: ignore[no-untyped-def]
    def hook(job_id: int) -> None:
        raise exc

    return hook


def fail_until_dead(job: CleanupJob, clock, exc: BaseException) -> None:  # type: ignore[no-untyped-def]
    for _ in range(20):
        job.refresh_from_db()
        if job.state == JobState.DEAD:
            return
        clock.move_to(job.available_at, tick=False)
        job_run_slice(job_id=job.pk, before_batch=raising(exc))
    raise AssertionError("the job never became dead")


class TestRetryAfter:
    def test_delta_seconds_and_http_dates_name_an_instant(self):
        assert parse_retry_after("7", now=NOW) == NOW + timedelta(seconds=7)
        later = NOW + timedelta(seconds=90)
        assert parse_retry_after(format_datetime(later, usegmt=True), now=NOW) == later

    @pytest.mark.parametrize("value", ["-5", "soon", "", "Wed, 99 Foo 2026 25:00:00 GMT", "9999999"])
    def test_negative_unparseable_or_absurd_values_are_ignored(self, value):
        assert parse_retry_after(value, now=NOW) is None

    def test_an_http_date_in_the_past_is_ignored(self):
        assert parse_retry_after(format_datetime(NOW - timedelta(minutes=1), usegmt=True), now=NOW) is None

    @pytest.mark.parametrize("value", ["\u0663", "\u00b2", "\uff17", "\u0667\u0667"])
    def test_only_ascii_digits_are_delta_seconds(self, value):
        # str.isdigit accepts these (and int() reads some, rejects others).
        assert value.isdigit()
        assert parse_retry_after(value, now=NOW) is None

    @pytest.mark.parametrize("value", ["9" * 20, "9" * 400, "1" + "0" * 12, str(10**18)])
    def test_a_huge_number_is_ignored_without_overflowing(self, value):
        assert parse_retry_after(value, now=NOW) is None
        assert classify(DownstreamError(429, value), now=NOW).retry_after is None

    def test_leading_zeros_and_the_cap_itself_are_still_seconds(self):
        assert parse_retry_after("0007", now=NOW) == NOW + timedelta(seconds=7)
        assert parse_retry_after(" 21600 ", now=NOW) == NOW + timedelta(hours=6)
        assert parse_retry_after("21601", now=NOW) is None

    @given(value=st.one_of(st.text(), st.from_regex(r"[0-9]{1,40}", fullmatch=True)))
    def test_nothing_a_retry_after_header_carries_makes_the_classifier_raise(self, value):
        at = parse_retry_after(value, now=NOW)
        assert at is None or NOW <= at <= NOW + timedelta(hours=6)
        for status in (429, 503):
            result = classify(DownstreamError(status, value), now=NOW)
            assert result.category == FailureCategory.DOWNSTREAM_THROTTLED and result.retry_after == at


class TestBackoff:
    def test_full_jitter_stays_under_the_exponential_ceiling_and_the_cap(self):
        top = random.Random(0)
        top.uniform = lambda a, b: b  # the worst case of the jitter
        assert [backoff_delay(attempt=n, base=30, cap=1800, rng=top) for n in (1, 2, 3, 7, 12)] == [
            30,
            60,
            120,
            1800,
            1800,
        ]
        rng = random.Random(42)
        samples = [backoff_delay(attempt=3, base=30, cap=1800, rng=rng) for _ in range(200)]
        assert all(0 <= s <= 120 for s in samples) and min(samples) < 20 and max(samples) > 100


class TestClassification:
    @pytest.mark.parametrize(
        ("exc", "category", "retryable"),
        [
            (DownstreamError(429, "7"), FailureCategory.DOWNSTREAM_THROTTLED, True),
            (DownstreamError(503), FailureCategory.DOWNSTREAM_THROTTLED, True),
            (DownstreamError(408), FailureCategory.TIMEOUT, True),
            (DownstreamError(500), FailureCategory.DOWNSTREAM_UNAVAILABLE, True),
            (DownstreamError(404), FailureCategory.DOWNSTREAM_REJECTED, False),
            (DownstreamTimeout(), FailureCategory.TIMEOUT, True),
            (InvalidInput(), FailureCategory.POLICY_OR_INPUT, False),
            (KeyError("x"), FailureCategory.UNEXPECTED, True),
        ],
    )
    def test_one_table_decides_category_and_disposition(self, exc, category, retryable):
        result = classify(exc, now=NOW)
        assert (result.category, result.retryable, result.error_class) == (category, retryable, type(exc).__name__)


class TestRetries:
    def test_a_duplicate_enqueue_of_a_leased_job_returns_quietly(self, job):
        lease = job_lease(job_id=job.pk, owner="first")
        duplicate = job_run_slice(job_id=job.pk)
        assert lease is not None and duplicate.leased is False and duplicate.batches == 0
        assert not LedgerEntry.objects.exists()

    def test_a_lease_that_expires_just_before_the_acknowledgement_is_finished_by_another_worker_once(
        self, job, prop, clock, settings
    ):
        loaded = job_load(job.pk)
        first = job_lease(job_id=job.pk, owner="first")
        assert run_batch(job=loaded, lease=first, limit=4)[0] == 4
        clock.move_to(NOW + timedelta(seconds=settings.CLEANUP_LEASE_SECONDS + 1), tick=False)
        assert job.pk in fair_due_job_ids(now=timezone.now(), limit=10)  # rescued: the lease expired
        second = job_lease(job_id=job.pk, owner="second")
        assert second is not None
        assert job_release(lease=first) is False  # the late acknowledgement changes nothing
        assert run_batch(job=loaded, lease=second, limit=4) == (2, "deleted")  # a short batch ends the job
        assert sum(LedgerEntry.objects.values_list("rows_deleted", flat=True)) == 6
        assert LedgerEntry.objects.count() == 2
        assert remaining_ids(prop, "lease") == set()

    @pytest.mark.parametrize("header", ["7", "http-date"])
    def test_a_429_with_retry_after_is_not_leased_one_second_early(self, job, clock, header):
        retry_at = NOW + timedelta(seconds=7)
        value = "7" if header == "7" else format_datetime(retry_at, usegmt=True)
        result = job_run_slice(job_id=job.pk, before_batch=raising(DownstreamError(429, value)))
        assert result.error_category == FailureCategory.DOWNSTREAM_THROTTLED
        job.refresh_from_db()
        assert job.state == JobState.PENDING and job.attempt == 1
        assert retry_at <= job.available_at <= retry_at + timedelta(seconds=2)
        clock.move_to(job.available_at - timedelta(seconds=1), tick=False)
        assert job_run_slice(job_id=job.pk).leased is False
        assert job.pk not in fair_due_job_ids(now=job.available_at - timedelta(seconds=1), limit=10)
        clock.move_to(job.available_at, tick=False)
        assert job_run_slice(job_id=job.pk).outcome == "deleted"

    def test_a_timeout_after_the_cleanup_commit_retries_without_doing_anything_twice(self, job, prop, clock):
        result = job_run_slice(job_id=job.pk, batch_size=4, after_batch=raising(DownstreamTimeout()))
        assert result.rows_deleted == 4 and result.error_category == FailureCategory.TIMEOUT
        job.refresh_from_db()
        assert (job.state, job.attempt, job.rows_deleted) == (JobState.PENDING, 1, 4)
        clock.move_to(job.available_at, tick=False)
        assert job_run_slice(job_id=job.pk, batch_size=4).outcome == "deleted"
        entries = list(LedgerEntry.objects.all())
        assert [e.rows_deleted for e in entries] == [4, 2]
        assert remaining_ids(prop, "lease") == set()

    def test_an_exhausted_attempt_budget_makes_a_dead_letter(self, job, clock, settings):
        settings.CLEANUP_MAX_ATTEMPTS = 3
        fail_until_dead(job, clock, KeyError("boom"))
        job.refresh_from_db()
        letter = DeadLetter.objects.get(job=job)
        assert (letter.category, letter.attempts, job.attempt) == (FailureCategory.RETRY_BUDGET_EXHAUSTED, 3, 3)
        assert (letter.error_class, letter.status) == ("KeyError", DeadLetter.Status.OPEN)
        assert Sweep.objects.get().status == Sweep.Status.DRAINED_WITH_DEAD_LETTERS

    def test_an_exhausted_age_budget_makes_a_dead_letter(self, job, clock, settings):
        settings.CLEANUP_MAX_AGE_SECONDS = 3600
        settings.CLEANUP_BACKOFF_BASE_SECONDS = 600
        settings.CLEANUP_BACKOFF_CAP_SECONDS = 600
        job_run_slice(job_id=job.pk, batch_size=1, max_batches=1)  # first attempt: the age clock starts
        # Past the age budget: whatever the jittered delay (>= 0), the next try would be too late.
        clock.move_to(NOW + timedelta(seconds=3601), tick=False)
        job_run_slice(job_id=job.pk, before_batch=raising(DownstreamError(500)))
        letter = DeadLetter.objects.get(job=job)
        assert letter.category == FailureCategory.AGE_BUDGET_EXHAUSTED and letter.attempts == 1

    def test_terminal_failures_dead_letter_at_once_without_burning_the_budget(self, job):
        job_run_slice(job_id=job.pk, before_batch=raising(DownstreamError(400)))
        job.refresh_from_db()
        assert job.state == JobState.DEAD and job.attempt == 0
        assert DeadLetter.objects.get().category == FailureCategory.DOWNSTREAM_REJECTED

    def test_a_dead_job_holds_no_lease_and_is_never_dispatched_or_leased(self, job, clock):
        job_run_slice(job_id=job.pk, before_batch=raising(InvalidInput()))
        job.refresh_from_db()
        assert job.state == JobState.DEAD and job.lease_token is None and job.lease_expires_at is None
        clock.move_to(NOW + timedelta(days=3), tick=False)
        assert fair_due_job_ids(now=NOW + timedelta(days=3), limit=10, exclude_enqueued=False) == []
        assert job_lease(job_id=job.pk, owner="x") is None

    def test_failures_store_a_category_and_class_never_the_message(self, job):
        job_run_slice(job_id=job.pk, before_batch=raising(InvalidInput("tenant Jane Doe, 12 Elm St")))
        job.refresh_from_db()
        letter = DeadLetter.objects.get()
        stored = " ".join(str(v) for v in [*vars(job).values(), *vars(letter).values()])
        assert "Jane" not in stored and "Elm" not in stored
        assert (letter.category, letter.error_class) == ("policy_or_input", "InvalidInput")

    def test_a_rate_limit_deferral_is_not_an_attempt(self, job, settings):
        settings.CLEANUP_RATE_PORTFOLIO = 0.01  # one batch per 100 s
        settings.CLEANUP_BURST_PORTFOLIO = 1
        first = job_run_slice(job_id=job.pk, batch_size=2)
        assert first.batches == 1 and first.deferred_seconds > 50
        job.refresh_from_db()
        assert job.state == JobState.PENDING and job.attempt == 0
        assert job.available_at >= NOW + timedelta(seconds=50)


@pytest.fixture
def letter(job, clock):
    job_run_slice(job_id=job.pk, before_batch=raising(DownstreamError(400)))
    return DeadLetter.objects.get()


class TestRedrive:
    def test_redrive_creates_a_new_job_and_the_old_one_stays_dead(self, letter, operator_user, prop, clock):
        new = dead_letter_redrive(letter_id=letter.pk, actor=operator_user, reason=REASON)
        old = letter.job
        old.refresh_from_db()
        letter.refresh_from_db()
        assert new.pk != old.pk and new.key == f"{old.key}:redrive:1"
        assert (new.attempt, new.state, new.available_at, new.redrive_of_id) == (0, JobState.PENDING, NOW, old.pk)
        assert old.state == JobState.DEAD
        assert (letter.status, letter.redrive_job_id, letter.resolved_by) == ("redriven", new.pk, operator_user)
        event = AuditEvent.objects.get(action="dead_letter.redriven")
        assert event.reason == REASON and event.details["new_job_id"] == new.pk
        assert Sweep.objects.get().status == Sweep.Status.RUNNING
        assert job_run_slice(job_id=new.pk).outcome == "deleted"
        assert remaining_ids(prop, "lease") == set()
        # The redrive did the old job's work: the sweep is drained (issue 30, item 8).
        assert Sweep.objects.get().status == Sweep.Status.DRAINED

    @pytest.mark.parametrize("reason", [None, "", "   ", "too short", "  short   "])
    def test_redrive_without_a_reason_or_with_a_short_one_is_refused(self, letter, operator_user, reason):
        with pytest.raises(ValidationError) as info:
            dead_letter_redrive(letter_id=letter.pk, actor=operator_user, reason=reason)
        assert "reason" in info.value.message_dict
        assert CleanupJob.objects.count() == 1 and not AuditEvent.objects.filter(action__startswith="dead").exists()

    def test_redriving_a_dismissed_letter_says_its_status(self, letter, operator_user):
        dead_letter_dismiss(letter_id=letter.pk, actor=operator_user, reason="a known bad record, ignore")
        with pytest.raises(DeadLetterNotOpen, match="is dismissed, not open"):
            dead_letter_redrive(letter_id=letter.pk, actor=operator_user, reason=REASON)
        assert CleanupJob.objects.count() == 1

    def test_redriving_twice_says_it_was_redriven(self, letter, operator_user):
        dead_letter_redrive(letter_id=letter.pk, actor=operator_user, reason=REASON)
        with pytest.raises(DeadLetterNotOpen, match="is redriven, not open"):
            dead_letter_redrive(letter_id=letter.pk, actor=operator_user, reason=REASON)

    def test_a_user_without_the_permission_cannot_redrive_or_dismiss(self, letter, auditor, manager):
        for user in (auditor, manager):
            with pytest.raises(PermissionDenied):
                dead_letter_redrive(letter_id=letter.pk, actor=user, reason=REASON)
            with pytest.raises(PermissionDenied):
                dead_letter_dismiss(letter_id=letter.pk, actor=user, reason=REASON)
        letter.refresh_from_db()
        assert letter.status == DeadLetter.Status.OPEN

    def test_bulk_redrive_by_filter_writes_one_audit_event_per_letter(
        self, portfolio, active_policy, clock, operator_user
    ):
        active_policy(portfolio, "lease", 365)
        props = [Property.objects.create(portfolio=portfolio, name=f"B{i}") for i in range(3)]
        for p in props:
            make_records(p, "lease", 2, ended=OLD)
        sweep_trigger(slot=SLOT, now=NOW)
        jobs = list(CleanupJob.objects.order_by("id"))
        job_run_slice(job_id=jobs[0].pk, before_batch=raising(DownstreamError(400)))
        job_run_slice(job_id=jobs[1].pk, before_batch=raising(DownstreamError(403)))
        job_run_slice(job_id=jobs[2].pk, before_batch=raising(InvalidInput()))
        redriven = dead_letters_redrive_bulk(
            actor=operator_user, reason=REASON, letter_filter=DeadLetterFilter(category="downstream_rejected")
        )
        assert len(redriven) == 2
        assert AuditEvent.objects.filter(action="dead_letter.redriven").count() == 2
        assert DeadLetter.objects.get(category="policy_or_input").status == DeadLetter.Status.OPEN

    def test_a_redrive_of_a_redrive_keeps_a_bounded_key_numbered_per_root(self, letter, operator_user, clock):
        root = letter.job.key
        keys = []
        for n in range(1, 5):
            new = dead_letter_redrive(letter_id=letter.pk, actor=operator_user, reason=REASON)
            keys.append(new.key)
            # The redrive fails the same way and becomes the next dead letter.
            job_run_slice(job_id=new.pk, before_batch=raising(DownstreamError(400)))
            letter = DeadLetter.objects.get(job=new)
            previous = CleanupJob.objects.get(key=keys[-2] if n > 1 else root)
            assert new.redrive_of_id == previous.pk  # the chain is kept; only the key stays short
        assert keys == [f"{root}:redrive:{n}" for n in range(1, 5)]

    def test_one_letter_that_cannot_be_redriven_does_not_roll_back_the_others_and_is_reported(
        self, portfolio, active_policy, clock, operator_user, monkeypatch
    ):
        from cleanup_ops.recovery import operator

        active_policy(portfolio, "lease", 365)
        for i in range(3):
            make_records(Property.objects.create(portfolio=portfolio, name=f"B{i}"), "lease", 2, ended=OLD)
        sweep_trigger(slot=SLOT, now=NOW)
        jobs = list(CleanupJob.objects.order_by("id"))
        for job in jobs:
            job_run_slice(job_id=job.pk, before_batch=raising(DownstreamError(400)))
        letters = list(DeadLetter.objects.order_by("id"))
        broken = letters[1]
        real_key = operator.redrive_key

        def colliding_key(job: CleanupJob) -> str:
            # A key that already exists: a real unique violation in the database.
            return jobs[0].key if job.pk == broken.job_id else real_key(job)

        monkeypatch.setattr(operator, "redrive_key", colliding_key)
        result = dead_letters_redrive_bulk(actor=operator_user, reason=REASON, letter_filter=DeadLetterFilter())
        assert [job.redrive_of_id for job in result] == [letters[0].job_id, letters[2].job_id]
        assert [(f.letter_id, f.error_class) for f in result.failed] == [(broken.pk, "IntegrityError")]
        statuses = dict(DeadLetter.objects.values_list("pk", "status"))
        assert statuses == {letters[0].pk: "redriven", broken.pk: "open", letters[2].pk: "redriven"}
        assert AuditEvent.objects.filter(action="dead_letter.redriven").count() == 2
        assert CleanupJob.objects.filter(redrive_of__isnull=False).count() == 2

        # The console and the command say which letter stayed open.
        from django.test import Client

        monkeypatch.setattr(operator, "redrive_key", lambda job: jobs[0].key)
        client = Client()
        client.force_login(operator_user)
        page = client.post(
            "/console/dead-letters/action/",
            {"operation": "redrive", "letter": [broken.pk], "reason": REASON, "confirm": "yes"},
            follow=True,
        )
        message = f"1 letter could not be redriven and is still open: {broken.pk} (IntegrityError)"
        assert message in page.content.decode()
        out, err = StringIO(), StringIO()
        call_command(
            "cleanup_redrive", "--category", "downstream_rejected", "--reason", REASON, "--json", stdout=out, stderr=err
        )
        reported = json.loads(out.getvalue())
        assert reported["failed"] == [{"letter_id": broken.pk, "error_class": "IntegrityError", "open_job_id": None}]
        assert DeadLetter.objects.get(pk=broken.pk).status == "open"

    def test_the_redrive_command_redrives_by_category_and_rejects_bad_flags(self, letter, clock):
        with pytest.raises(CommandError, match="--category: unknown"):
            call_command("cleanup_redrive", "--category", "nope", "--reason", REASON, stdout=StringIO())
        with pytest.raises(CommandError, match="--reason"):
            call_command("cleanup_redrive", "--category", "downstream_rejected", "--reason", "x", stdout=StringIO())
        with pytest.raises(CommandError, match="--portfolio: no portfolio"):
            call_command(
                "cleanup_redrive", "--category", "downstream_rejected", "--portfolio", "9999", "--reason", REASON
            )
        assert CleanupJob.objects.count() == 1
        out = StringIO()
        call_command("cleanup_redrive", "--category", "downstream_rejected", "--reason", REASON, stdout=out)
        assert "1 dead letters redriven" in out.getvalue()
        assert CleanupJob.objects.filter(redrive_of=letter.job).count() == 1


class TestPause:
    def test_a_global_pause_stops_new_leases_lets_in_flight_slices_finish_and_resume_is_audited(
        self, job, operator_user, prop
    ):
        lease = job_lease(job_id=job.pk, owner="in-flight")
        pipeline_pause(actor=operator_user, reason="database failover drill")
        loaded = job_load(job.pk)
        assert run_batch(job=loaded, lease=lease, limit=100)[0] == 6  # the in-flight slice finishes
        CleanupJob.objects.filter(pk=job.pk).update(state=JobState.PENDING, outcome="", lease_token=None)
        assert job_lease(job_id=job.pk, owner="new") is None
        pipeline_resume(actor=operator_user, reason="drill finished, resuming")
        assert job_lease(job_id=job.pk, owner="new") is not None
        actions = list(AuditEvent.objects.order_by("id").values_list("action", flat=True))
        assert actions[-2:] == ["pipeline.paused", "pipeline.resumed"]

    def test_a_portfolio_pause_stops_only_that_portfolio(self, job, operator_user, portfolio, active_policy):
        from properties.models import Portfolio

        other = Portfolio.objects.create(name="Other", slug="other")
        other_job = CleanupJob.objects.create(
            sweep=job.sweep,
            key="other",
            portfolio_id=other.pk,
            property_id=Property.objects.create(portfolio=other, name="O").pk,
            record_kind="lease",
            policy_version=job.policy_version,
            cutoff=job.cutoff,
            available_at=NOW,
        )
        pipeline_pause(actor=operator_user, reason="customer asked to wait", portfolio_id=portfolio.pk)
        assert job_lease(job_id=job.pk, owner="x") is None
        assert job_lease(job_id=other_job.pk, owner="x") is not None
        with pytest.raises(ValidationError):
            pipeline_pause(actor=operator_user, reason="customer asked to wait", portfolio_id=portfolio.pk)

    def test_pausing_needs_a_reason_and_the_permission(self, job, operator_user, auditor):
        with pytest.raises(ValidationError):
            pipeline_pause(actor=operator_user, reason="")
        with pytest.raises(PermissionDenied):
            pipeline_pause(actor=auditor, reason="auditors cannot pause")
        assert job_lease(job_id=job.pk, owner="x") is not None
