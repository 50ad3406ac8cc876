"""A cleanup job's state machine, in one place.

The states are ``JobState``; the table below is every transition the code
makes, and the functions after it are the only places that decide a new state
or an outcome. The writers elsewhere (the lease and release in
``execution.leases``, the batch's job update in ``execution.batches`` and its
SQL in ``execution.statements.group_jobs_advance``, the purge's finish,
``CleanupJob.mark_retry`` and ``mark_dead``) take the fields they write from
here, so no state or outcome is decided in SQL. Where SQL must tell states
apart (the batch's update keeps the lease of a job an *advance* left leased
and clears a *finished* one's; a sweep is drained once none of its jobs is
open), the states it names come from ``TRANSITIONS`` (``state_after``,
``OPEN_STATES``).

====================  ======================================  ===========
event                 from                                    to
====================  ======================================  ===========
lease                 pending and due; leased, lease expired  leased
release (deferral)    leased by us                            pending
advance (a batch)     leased by us                            leased
finish                leased by us                            done
retry (a failure)     leased by us                            pending
fail (out of budget)  leased by us                            dead
cancel (an operator)  pending                                 dead
====================  ======================================  ===========

``done`` and ``dead`` are final for the row: a redrive creates a new pending
job (``recovery.operator``), and the partial unique index
``job_one_open_per_partition`` lets at most one open delete job exist per
partition at any time. "Leased by us" is the fence (the batch's first statement,
``execution.statements.group_fence_scopes_and_policies``, and ``leases.lock_job`` elsewhere): a
worker whose lease expired matches no row and writes nothing for that job.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Value
from django.db.models.functions import Coalesce


class JobState(models.TextChoices):
    PENDING = "pending", "Pending"  # waiting for available_at, or due
    LEASED = "leased", "Leased"  # a worker holds it until lease_expires_at
    DONE = "done", "Done"  # finished with an outcome
    DEAD = "dead", "Dead"  # stopped; an operator decides (dead letters)


class JobOutcome(models.TextChoices):
    DELETED = "deleted", "Deleted"
    PURGED = "purged", "Attachments purged"
    # Some attachments were set aside: a legal hold over the deleted records'
    # scope was placed before they were purged. A later sweep retries them
    # once the hold is released (``downstream.purge.purge_requeue_released``).
    PURGE_HELD = "purge_held", "Attachments set aside under a legal hold"
    NOTHING_ELIGIBLE = "nothing_eligible", "Nothing eligible"
    HELD = "held", "Held"
    SCOPE_MISSING = "scope_missing", "Scope missing"
    POLICY_WITHDRAWN = "policy_withdrawn", "Policy withdrawn"


class JobEvent(StrEnum):
    LEASE = "lease"
    RELEASE = "release"
    ADVANCE = "advance"
    FINISH = "finish"
    RETRY = "retry"
    FAIL = "fail"
    CANCEL = "cancel"


# event -> (states it applies to, the state it leads to). ``leased`` as a
# source of ``lease`` means a leased job whose lease has expired (``due_q``).
TRANSITIONS: dict[JobEvent, tuple[frozenset[str], str]] = {
    JobEvent.LEASE: (frozenset({JobState.PENDING, JobState.LEASED}), JobState.LEASED),
    JobEvent.RELEASE: (frozenset({JobState.LEASED}), JobState.PENDING),
    JobEvent.ADVANCE: (frozenset({JobState.LEASED}), JobState.LEASED),
    JobEvent.FINISH: (frozenset({JobState.LEASED}), JobState.DONE),
    JobEvent.RETRY: (frozenset({JobState.LEASED}), JobState.PENDING),
    JobEvent.FAIL: (frozenset({JobState.LEASED}), JobState.DEAD),
    JobEvent.CANCEL: (frozenset({JobState.PENDING}), JobState.DEAD),
}


# A state no event leaves is final (``done``, ``dead``): the job's work is
# over. Every other state is open. The SQL that tests for either
# (``sweeps._sweep_finish_if_drained``, admission's open-elsewhere test) takes
# the sets from here.
FINAL_STATES: frozenset[str] = frozenset(target for _, target in TRANSITIONS.values()) - frozenset(
    state for sources, _ in TRANSITIONS.values() for state in sources
)
OPEN_STATES: tuple[str, ...] = tuple(state for state in JobState.values if state not in FINAL_STATES)


def state_after(event: JobEvent) -> str:
    """The state ``event`` leads to (the table's last column), for SQL that
    tells one transition's rows from another's (``execution.statements.group_jobs_advance``)."""
    return TRANSITIONS[event][1]


class TransitionRefused(ValueError):
    """A transition the table does not allow (a programming error, never an operator's)."""


def next_state(event: JobEvent, current: str) -> str:
    """The state ``event`` leads to from ``current``; ``TransitionRefused`` if it may not happen."""
    sources, target = TRANSITIONS[event]
    if current not in sources:
        raise TransitionRefused(f"{event}: not from {current}")
    return target


def outcome_when_finished(*, fixed: str = "", rows_deleted: int, rows_held: int) -> str:
    """Why a finished delete job ended: a fixed reason (``scope_missing``,
    ``policy_withdrawn``) wins; otherwise from its totals — anything deleted is
    ``deleted``, else anything held is ``held``, else ``nothing_eligible``."""
    if fixed:
        return fixed
    if rows_deleted > 0:
        return JobOutcome.DELETED
    if rows_held > 0:
        return JobOutcome.HELD
    return JobOutcome.NOTHING_ELIGIBLE


@dataclass
class JobAdvance:
    """One job's write at the end of a batch transaction (``execution.statements.ADVANCE_COLUMNS``)."""

    job_id: int
    new_cursor: int
    add_batches: int = 0
    add_deleted: int = 0
    add_held: int = 0
    batch_size: int = 0  # 0 keeps the job's recorded batch size
    state: str = JobState.LEASED
    outcome: str = ""


def after_batch(
    *,
    job_id: int,
    totals: tuple[int, int],
    new_cursor: int,
    finish: bool,
    fixed_outcome: str = "",
    batches: int = 0,
    deleted: int = 0,
    held: int = 0,
    batch_size: int = 0,
) -> JobAdvance:
    """The advance (still leased) or the finish (done, with its outcome) of a
    job that a batch transaction holds under its fence. ``totals`` are the
    job's rows deleted and held before this batch, read by the fence."""
    state = next_state(JobEvent.FINISH if finish else JobEvent.ADVANCE, JobState.LEASED)
    outcome = (
        outcome_when_finished(fixed=fixed_outcome, rows_deleted=totals[0] + deleted, rows_held=totals[1] + held)
        if finish
        else ""
    )
    return JobAdvance(job_id, new_cursor, batches, deleted, held, batch_size, state, outcome)


def leased_fields(*, token: Any, owner: str, now: datetime) -> dict[str, Any]:
    """The fields a lease writes (one job or a group)."""
    return {
        "state": next_state(JobEvent.LEASE, JobState.PENDING),
        "lease_token": token,
        "lease_owner": owner[:100],
        "lease_expires_at": now + timedelta(seconds=settings.CLEANUP_LEASE_SECONDS),
        "leases": F("leases") + 1,
        "enqueued_at": None,
        "first_leased_at": Coalesce(F("first_leased_at"), Value(now)),
    }


# A job's lease columns as they are with no lease: the one definition, written by
# every transition that leaves a lease — release (``released_fields``), retry and
# fail (``CleanupJob._clear_lease``), finish one job (``leases.job_finish``) or a
# group's (``execution.statements.group_jobs_advance``: the SQL is rendered from
# this mapping). ``enqueued_at`` is here as well as in ``leased_fields``: a job
# out of a lease has no broker message the dispatcher should wait for (one sent
# after the lease expired is stale), so a release for later marks it again
# (``dispatch.hint_due_at``, after this).
LEASE_CLEARED: dict[str, Any] = {"lease_token": None, "lease_owner": "", "lease_expires_at": None, "enqueued_at": None}


def released_fields(*, available_at: datetime | None) -> dict[str, Any]:
    """The fields a release writes: pending again, cursor kept, due at
    ``available_at`` (None: the job keeps its ``available_at``)."""
    fields: dict[str, Any] = {"state": next_state(JobEvent.RELEASE, JobState.LEASED), **LEASE_CLEARED}
    if available_at is not None:
        fields["available_at"] = available_at
    return fields
