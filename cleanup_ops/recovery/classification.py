"""Failure classification: one table of rules, a closed set of categories.

Every failure of a slice is classified by the first matching rule in
``RULES``. A disposition says what happens next:

- ``retry``: the job goes back to pending with a backoff delay (or no earlier
  than the ``Retry-After`` instant) and its attempt count grows; when the
  attempt or age budget runs out it becomes a dead letter instead.
- ``dead``: straight to a dead letter; no retry budget is burned.

Classified no-ops (``held``, ``scope_missing``, ``policy_withdrawn``,
``nothing_eligible``) are not failures at all: they are job *outcomes*,
acknowledged and finished (see ``JobOutcome``).

Only the category, the exception's class name and, for an HTTP answer, its
status and *message class* are ever stored: messages can quote record data,
and response bodies are never kept (not even read). The message class is the
media type the store declared for its answer (``Content-Type`` without
parameters, e.g. ``application/problem+json``), checked against a token
pattern so nothing else can be smuggled through it; "" when the answer
declared none.
"""

from __future__ import annotations

import email.utils
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import DatabaseError, InterfaceError, OperationalError
from django.db.models import TextChoices

# Retry-After values beyond this are treated as absurd and ignored (backoff applies).
MAX_RETRY_AFTER = timedelta(hours=6)
# Delta-seconds: ASCII digits only. More digits than this is absurd on its face
# (and would not fit a timedelta): rejected before ``int`` reads it.
_DELTA_SECONDS = re.compile(r"[0-9]+")
_MAX_DELTA_DIGITS = 12


class FailureCategory(TextChoices):
    DOWNSTREAM_THROTTLED = "downstream_throttled", "Downstream throttled (429/503)"
    DOWNSTREAM_UNAVAILABLE = "downstream_unavailable", "Downstream error (5xx)"
    TIMEOUT = "timeout", "Timeout before the effect was known"
    TRANSIENT_DATABASE = "transient_database", "Transient database error"
    LEASE_LOST = "lease_lost", "Lease lost"
    UNEXPECTED = "unexpected", "Unexpected error"
    POLICY_OR_INPUT = "policy_or_input", "Invalid policy or input"
    DOWNSTREAM_REJECTED = "downstream_rejected", "Downstream rejected (4xx)"
    RETRY_BUDGET_EXHAUSTED = "retry_budget_exhausted", "Attempt budget exhausted"
    AGE_BUDGET_EXHAUSTED = "age_budget_exhausted", "Age budget exhausted"
    # Not a failure of the job: an operator stopped it (``recovery.operator.jobs_cancel``).
    # Its dead letter can be redriven like any other.
    CANCELLED = "cancelled", "Cancelled by an operator"


# A media type: ``type/subtype`` of token characters (RFC 9110 §8.3.1), at most 100.
_MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,40}/[a-z0-9][a-z0-9!#$&^_.+-]{0,57}")


def message_class_of(content_type: str | None) -> str:
    """The media type of ``Content-Type`` (lower case, parameters dropped), or
    "" when it is absent or not a well-formed media type."""
    if not content_type:
        return ""
    media = content_type.split(";", 1)[0].strip().lower()
    return media if _MEDIA_TYPE.fullmatch(media) else ""


class DownstreamError(Exception):
    """A downstream dependency answered with an HTTP error status.

    Carries the status, the raw ``Retry-After`` header and the answer's
    message class (``message_class_of``) only, never a body.
    """

    def __init__(self, status: int, retry_after: str | None = None, content_type: str | None = None) -> None:
        super().__init__(f"downstream answered HTTP {status}")
        self.status = status
        self.retry_after = retry_after
        self.message_class = message_class_of(content_type)


class DownstreamTimeout(Exception):
    """The downstream call timed out: its effect is unknown."""


class DownstreamConnectionError(Exception):
    """No answer at all (refused, reset, DNS): retried with backoff like a 5xx."""


class StaleDecision(Exception):
    """The store refused a delete whose decision's fencing deadline had passed
    (``Fence-Deadline``): the purge's locks may be gone, so nothing was
    applied; the purge decides again."""


class InvalidInput(Exception):
    """The job's policy or input cannot be executed as it stands."""


class LeaseLost(Exception):
    """Our lease token is gone or expired: another worker may own the job."""


RETRY = "retry"
DEAD = "dead"


@dataclass(frozen=True)
class Rule:
    category: FailureCategory
    disposition: str
    matches: Callable[[BaseException], bool]


def _status(exc: BaseException, test: Callable[[int], bool]) -> bool:
    return isinstance(exc, DownstreamError) and test(exc.status)


def _transient_db(exc: BaseException) -> bool:
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    # serialization_failure (40001), deadlock_detected (40P01) surface as
    # other DatabaseError subclasses on psycopg; match them by SQLSTATE.
    cause = exc.__cause__
    return isinstance(exc, DatabaseError) and getattr(cause, "sqlstate", None) in {"40001", "40P01"}


RULES: tuple[Rule, ...] = (
    Rule(FailureCategory.DOWNSTREAM_THROTTLED, RETRY, lambda e: _status(e, lambda s: s in (429, 503))),
    Rule(
        FailureCategory.TIMEOUT,
        RETRY,
        lambda e: isinstance(e, DownstreamTimeout | TimeoutError) or _status(e, lambda s: s == 408),
    ),
    # Nothing was applied: decide again under fresh locks, like a timeout.
    Rule(FailureCategory.TIMEOUT, RETRY, lambda e: isinstance(e, StaleDecision)),
    # A redirect is never followed (the destination comes from settings only),
    # so it is as final as a 4xx: an operator has to look at the store's setup.
    Rule(FailureCategory.DOWNSTREAM_REJECTED, DEAD, lambda e: _status(e, lambda s: 300 <= s < 500)),
    Rule(
        FailureCategory.DOWNSTREAM_UNAVAILABLE,
        RETRY,
        lambda e: _status(e, lambda s: s >= 500) or isinstance(e, DownstreamConnectionError),
    ),
    Rule(FailureCategory.LEASE_LOST, RETRY, lambda e: isinstance(e, LeaseLost)),
    Rule(FailureCategory.TRANSIENT_DATABASE, RETRY, _transient_db),
    Rule(FailureCategory.POLICY_OR_INPUT, DEAD, lambda e: isinstance(e, InvalidInput | ValidationError)),
)


# Categories whose failure is never retried: the job dies on it, and its
# ``attempt`` (the retry budget spent) does not count that failed attempt.
FINAL_CATEGORIES = frozenset(
    rule.category for rule in RULES if all(r.disposition == DEAD for r in RULES if r.category == rule.category)
)


@dataclass(frozen=True)
class Classification:
    category: FailureCategory
    disposition: str
    error_class: str
    retry_after: datetime | None = None
    # The store's answer, when there was one (a ``DownstreamError``).
    http_status: int | None = None
    message_class: str = ""

    @property
    def retryable(self) -> bool:
        return self.disposition == RETRY


def classify(exc: BaseException, *, now: datetime) -> Classification:
    for rule in RULES:
        if rule.matches(exc):
            retry_after = None
            if isinstance(exc, DownstreamError) and exc.retry_after is not None:
                retry_after = parse_retry_after(exc.retry_after, now=now)
            if isinstance(exc, DownstreamError):
                return Classification(
                    rule.category,
                    rule.disposition,
                    type(exc).__name__,
                    retry_after,
                    http_status=exc.status,
                    message_class=exc.message_class,
                )
            return Classification(rule.category, rule.disposition, type(exc).__name__, retry_after)
    return Classification(FailureCategory.UNEXPECTED, RETRY, type(exc).__name__)


def parse_retry_after(value: object, *, now: datetime) -> datetime | None:
    """The instant a ``Retry-After`` header names (RFC 9110 §10.2.3), or None.

    Delta-seconds (ASCII digits only: ``str.isdigit`` would also take other
    Unicode digits, which ``int`` then reads) or an HTTP-date. Negative,
    unparseable, or more than ``MAX_RETRY_AFTER`` away: None, so ordinary
    backoff applies. Never raises, whatever the header carries: a number too
    large for a ``timedelta`` is rejected by its length before any arithmetic.
    """
    if not isinstance(value, str):
        return None
    text = value.strip()
    if _DELTA_SECONDS.fullmatch(text):
        digits = text.lstrip("0") or "0"
        if len(digits) > _MAX_DELTA_DIGITS or int(digits) > MAX_RETRY_AFTER.total_seconds():
            return None
        return now + timedelta(seconds=int(digits))
    try:
        parsed = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if parsed is None:
        return None
    at = parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    try:
        ahead = at - now
    except (TypeError, OverflowError):
        return None
    if ahead < timedelta(0) or ahead > MAX_RETRY_AFTER:
        return None
    return at


def backoff_delay(*, attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter: uniform(0, min(cap, base * 2^(attempt-1)))."""
    ceiling = min(cap, base * (2 ** max(0, attempt - 1)))
    return (rng or random).uniform(0, ceiling)


def retry_after_jitter(*, rng: random.Random | None = None) -> float:
    """A small spread so jobs deferred to the same instant do not wake together."""
    return (rng or random).uniform(0, 2.0)
