"""Token buckets in the database, shared by every worker on every host.

One bucket is a row (``RateBucket``): ``tokens`` as of the instant
``updated_at`` (epoch seconds, the database's clock: ``cleanup_ops.clock``),
refilled at ``rate`` up to ``burst`` from that instant on. There is no refill
process.

Protocol (a *reservation*, ``tokens_reserve``; the buckets' "virtual
scheduling", as in GCRA):

- **Learn when, don't poll.** A worker that needs tokens asks once: one
  statement (``_bucket_reserve``) locks the rows, computes when each will
  have a token and the instant ``at`` at which the transaction can have all
  it needs, and — if the worker can wait that long — takes them *for that
  instant*: the row's state moves to ``at`` (``updated_at = at``, possibly in
  the future). The worker then sleeps until ``at``; it never asks again.
  Every later request, from any worker, is computed from that state and so
  gets an instant no earlier: reservations on a bucket are granted in time
  order and never exceed its rate plus its burst. A worker that cannot wait
  that long takes nothing and is told exactly when (its job is deferred
  until then).
- **Order, both or neither.** The portfolios' buckets are locked before the
  shared (global) one, portfolios by id (``_lock_order``), in reservations and
  give-backs alike, so two workers cannot deadlock on them. A transaction
  gets a portfolio's token only together with the global one; without the
  global token it takes no portfolio's.
- **Give back what was not used.** A transaction that took a portfolio's
  token but left that portfolio's partitions for the next one, or did not
  run (it raised, its worker was stopped while it slept), returns the token
  (``tokens_give_back``): a token pays for the batches of its own portfolio
  only, and a refused or unused global token must not slow everyone else.

Time is passed in (epoch seconds from ``clock.now_ts()``) so tests control it
with time-machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from psycopg import sql as pg

from cleanup_ops import sql
from cleanup_ops.models import LimitName, RateBucket, RuntimeLimit

# How long a process keeps the operators' run-time limits before reading them
# again (one query): a change reaches every worker within this time.
RUNTIME_LIMITS_CACHE_SECONDS = 5
_RUNTIME_LIMITS_KEY = "cleanup_ops:runtime_limits:until"  # (expiry, values); a new name for a new shape
_LIMIT_SETTINGS = {
    LimitName.RATE_GLOBAL: "CLEANUP_RATE_GLOBAL",
    LimitName.RATE_PORTFOLIO: "CLEANUP_RATE_PORTFOLIO",
    LimitName.PORTFOLIO_MAX_LEASES: "CLEANUP_PORTFOLIO_MAX_LEASES",
    LimitName.SLICE_SECONDS: "CLEANUP_SLICE_SECONDS",
}


# This process's copy of the cached entry, until the entry's own expiry: every
# token reservation asks for the limits, and on a shared default cache (Redis, a
# database cache) each ask would be a round trip. The entry carries its expiry, so
# the copy never outlives it and a change still reaches every worker within
# RUNTIME_LIMITS_CACHE_SECONDS.
_runtime_limits_copy: tuple[float, dict[str, float]] | None = None


def runtime_limits() -> dict[str, float]:
    """The operators' run-time values (``RuntimeLimit``), by name; cached, and kept by this process until the cached
    entry expires."""
    global _runtime_limits_copy
    now = time.time()
    if _runtime_limits_copy is not None and now < _runtime_limits_copy[0]:
        return _runtime_limits_copy[1]
    entry = cache.get(_RUNTIME_LIMITS_KEY)
    if entry is None:
        entry = (now + RUNTIME_LIMITS_CACHE_SECONDS, dict(RuntimeLimit.objects.values_list("name", "value")))
        cache.set(_RUNTIME_LIMITS_KEY, entry, RUNTIME_LIMITS_CACHE_SECONDS)
    _runtime_limits_copy = entry
    return entry[1]


def runtime_limits_forget() -> None:
    """After a change: this process reads them again at once (the others within RUNTIME_LIMITS_CACHE_SECONDS)."""
    global _runtime_limits_copy
    _runtime_limits_copy = None
    cache.delete(_RUNTIME_LIMITS_KEY)


def limit_setting(name: str) -> float:
    return float(getattr(settings, _LIMIT_SETTINGS[LimitName(name)]))


def limit_value(name: str) -> float:
    """A limit's value now: the operator's run-time value, else its setting."""
    return runtime_limits().get(name, limit_setting(name))


def portfolio_max_leases() -> int:
    return int(limit_value(LimitName.PORTFOLIO_MAX_LEASES))


def slice_seconds() -> float:
    """How long a job's turn may run: the operator's cap, never above the
    setting's (which the start-up checks weighed against the lease and the
    liveness thresholds)."""
    return min(limit_value(LimitName.SLICE_SECONDS), limit_setting(LimitName.SLICE_SECONDS))


@dataclass(frozen=True)
class BucketConfig:
    name: str
    rate: float  # tokens per second; 0 = unlimited
    burst: float


def effective_limits() -> dict[str, float | int]:
    return {
        "global_rate_per_s": limit_value(LimitName.RATE_GLOBAL),
        "global_burst": settings.CLEANUP_BURST_GLOBAL,
        "portfolio_rate_per_s": limit_value(LimitName.RATE_PORTFOLIO),
        "portfolio_burst": settings.CLEANUP_BURST_PORTFOLIO,
        "portfolio_max_leases": portfolio_max_leases(),
        "batch_size": settings.CLEANUP_BATCH_SIZE,
        "max_attempts": settings.CLEANUP_MAX_ATTEMPTS,
        "max_age_seconds": settings.CLEANUP_MAX_AGE_SECONDS,
        "backoff_base_seconds": settings.CLEANUP_BACKOFF_BASE_SECONDS,
        "backoff_cap_seconds": settings.CLEANUP_BACKOFF_CAP_SECONDS,
        "docstore_global_rate_per_s": settings.DOCSTORE_RATE_GLOBAL,
        "docstore_portfolio_rate_per_s": settings.DOCSTORE_RATE_PORTFOLIO,
    }


def portfolio_buckets(portfolio_id: int) -> list[BucketConfig]:
    rate = limit_value(LimitName.RATE_PORTFOLIO)
    if rate <= 0:
        return []
    return [BucketConfig(f"portfolio:{portfolio_id}", rate, settings.CLEANUP_BURST_PORTFOLIO)]


def global_buckets() -> list[BucketConfig]:
    rate = limit_value(LimitName.RATE_GLOBAL)
    if rate <= 0:
        return []
    return [BucketConfig("global", rate, settings.CLEANUP_BURST_GLOBAL)]


def buckets_for(portfolio_id: int) -> list[BucketConfig]:
    return portfolio_buckets(portfolio_id) + global_buckets()


def docstore_portfolio_buckets(portfolio_id: int) -> list[BucketConfig]:
    if settings.DOCSTORE_RATE_PORTFOLIO <= 0:
        return []
    rate, burst = settings.DOCSTORE_RATE_PORTFOLIO, settings.DOCSTORE_BURST_PORTFOLIO
    return [BucketConfig(f"docstore:portfolio:{portfolio_id}", rate, burst)]


def docstore_global_buckets() -> list[BucketConfig]:
    if settings.DOCSTORE_RATE_GLOBAL <= 0:
        return []
    return [BucketConfig("docstore:global", settings.DOCSTORE_RATE_GLOBAL, settings.DOCSTORE_BURST_GLOBAL)]


def docstore_buckets_for(portfolio_id: int) -> list[BucketConfig]:
    """The document store's own buckets (requests per second), apart from the
    delete buckets: purges never spend the database side's tokens, nor the
    other way round."""
    return docstore_portfolio_buckets(portfolio_id) + docstore_global_buckets()


@dataclass(frozen=True)
class TokenFamily:
    """Which buckets a kind of work spends: each portfolio's own and the shared
    ones. Deletes spend the database side's (``DELETES``), purges the document
    store's (``DOCSTORE``); a slice reserves, sleeps for and gives back either
    the same way (``execution.leases.group_tokens``)."""

    name: str
    own: Callable[[int], list[BucketConfig]]
    shared: Callable[[], list[BucketConfig]]


DELETES = TokenFamily("deletes", portfolio_buckets, global_buckets)
DOCSTORE = TokenFamily("docstore", docstore_portfolio_buckets, docstore_global_buckets)


# Float steps: a token accrued to within this of a whole one counts as there
# (a grant due "now" must not miss by rounding and wait a few femtoseconds).
EPSILON = 1e-9


@dataclass(frozen=True)
class Reservation:
    """What one reservation answered, on the database's clock (epoch seconds).

    ``reserved``: the tokens were taken for the instant ``at`` (``at == now``
    when they were there already) — one from the bucket of each portfolio in
    ``allowed`` and one from every shared bucket. Not reserved: nothing was
    taken, because ``at`` is further away than the caller could wait.
    ``ready``: for each portfolio asked about, when its own token and the
    shared ones are all there (``at`` or later), so a portfolio left out is
    deferred until exactly then.
    """

    now: float
    at: float
    reserved: bool
    allowed: frozenset[int] = frozenset()
    ready: dict[int, float] = field(default_factory=dict)

    @property
    def wait(self) -> float:
        """Seconds from ``now`` until ``at`` (0 when due now)."""
        return 0.0 if self.at - self.now <= EPSILON else self.at - self.now

    def wait_of(self, portfolio_id: int) -> float:
        """Seconds until ``portfolio_id``'s token and the shared ones are there."""
        at = self.ready.get(portfolio_id, self.at)
        return 0.0 if at - self.now <= EPSILON else at - self.now


# (portfolio id, bucket): a bucket of one portfolio, or None for a shared one
# (the global bucket; every bucket of a single-job request).
Member = tuple[int | None, BucketConfig]


def _lock_order(members: list[Member]) -> list[Member]:
    """The one order every reservation and give-back locks bucket rows in:
    portfolios' buckets by portfolio id, then the shared ones, in the order
    given (the global bucket last)."""
    own = sorted((m for m in members if m[0] is not None), key=lambda m: (m[0], m[1].name))
    return own + [m for m in members if m[0] is None]


def tokens_reserve(
    *, members: list[Member], now: float, max_wait: float, portfolio_ids: Iterable[int] = ()
) -> Reservation:
    """Reserve the tokens one transaction needs, for the earliest instant they are there.

    The instant ``at`` is the earliest at which every shared bucket has a
    token and at least one of the portfolios' buckets does (the portfolios
    whose token is there by then are ``allowed``; with no portfolio buckets,
    every portfolio is). If ``at - now <= max_wait`` the tokens are taken for
    ``at``: the row's state moves to the instant ``at`` (``tokens`` as of
    ``updated_at = at``), so every later request, from any worker, gets an
    instant no earlier and the rate holds however long each sleeps before
    ``at``. Otherwise nothing changes. Both or neither: a refused shared token
    takes no portfolio's.

    PostgreSQL: one statement (``_bucket_reserve``) that locks the rows in
    ``_lock_order``, decides and takes. No retry and no read after a miss:
    a worker learns ``at`` and sleeps until then. ``portfolio_ids``: the
    portfolios the transaction may touch, also those without a bucket of
    their own (an unlimited portfolio rate: only the shared buckets decide).
    """
    ordered = _lock_order(members)
    owners = sorted({*portfolio_ids, *(m[0] for m in members if m[0] is not None)})
    if not ordered:
        return Reservation(now=now, at=now, reserved=True, allowed=frozenset(owners), ready=dict.fromkeys(owners, now))
    rows = _reserve_rows(ordered, now=now, max_wait=max_wait)
    if rows is None:
        # First use of some bucket: create it full (a concurrent creator may
        # win; either way the row exists now) and ask again. Nothing was
        # taken by the first try: it takes only when every row is there.
        RateBucket.objects.bulk_create(
            [RateBucket(name=bucket.name, tokens=bucket.burst, updated_at=now) for _, bucket in ordered],
            ignore_conflicts=True,
        )
        rows = _reserve_rows(ordered, now=now, max_wait=max_wait)
        if rows is None:
            raise RuntimeError("rate buckets could not be created")
    ready_of, at, reserved = rows
    shared_ready = max([now, *(ready_of[b.name] for p, b in ordered if p is None)])
    ready: dict[int, float] = {}
    for owner in owners:
        own = [ready_of[b.name] for p, b in ordered if p == owner]
        ready[owner] = max([shared_ready, *own])
    allowed = frozenset(p for p, t in ready.items() if t <= at) if reserved else frozenset()
    return Reservation(now=now, at=at, reserved=reserved, allowed=allowed, ready=ready)


def _bucket_reserve() -> pg.Composed:
    """Reserve one token from each bucket for the earliest instant they are there.

    Parameters (named): ``names``, ``rates``, ``bursts``, ``shared`` (arrays,
    in lock order: the portfolios' buckets, then the shared ones), ``n`` (how
    many), ``now`` and ``max_wait`` (epoch seconds, seconds). The rows are
    locked in the order given (``FOR UPDATE`` under ``ORDER BY``), so two
    workers never wait on each other in a cycle. A bucket's *ready* instant:
    from the later of now and its state's instant (``updated_at``, in the
    future when reserved), the time its missing part of a token takes to
    refill (to within 1e-9: a whole token accrued in float steps must not miss
    by rounding). The instant ``at``: the latest ready of the shared buckets and the
    earliest of the portfolios'. When every row is there and ``at`` is within
    ``max_wait``, each bucket ready by ``at`` moves to its state at ``at`` less
    one token. One row per bucket found: name, its ready instant, ``at``, and
    how many buckets were taken from (0: none, nothing changed).
    """
    return sql.composed(
        """
        WITH want AS (
            SELECT * FROM unnest(%(names)s::text[], %(rates)s::float8[], %(bursts)s::float8[], %(shared)s::bool[])
            WITH ORDINALITY AS w(name, rate, burst, shared, ord)
        ),
        held AS (
            SELECT b.name, b.tokens, b.updated_at, w.rate, w.burst, w.shared, w.ord FROM {bucket} b
            JOIN want w ON w.name = b.name ORDER BY w.ord FOR UPDATE OF b
        ),
        ready AS (
            SELECT h.*, GREATEST(%(now)s::float8, h.updated_at) + GREATEST(0, 0.999999999 - LEAST(h.burst,
                h.tokens + GREATEST(0, %(now)s::float8 - h.updated_at) * h.rate)) / h.rate AS ready
            FROM held h
        ),
        plan AS (
            SELECT GREATEST(%(now)s::float8, COALESCE(MAX(ready) FILTER (WHERE shared), %(now)s::float8),
                COALESCE(MIN(ready) FILTER (WHERE NOT shared), %(now)s::float8)) AS at,
                COUNT(*) = %(n)s AS complete
            FROM ready
        ),
        taken AS (
            UPDATE {bucket} b SET tokens = LEAST(r.burst, r.tokens + (p.at - r.updated_at) * r.rate) - 1,
                updated_at = p.at
            FROM ready r, plan p
            WHERE b.name = r.name AND r.ready <= p.at AND p.complete
                AND p.at - %(now)s::float8 <= %(max_wait)s::float8
            RETURNING b.name
        )
        SELECT r.name, r.ready, p.at, (SELECT COUNT(*) FROM taken) FROM ready r, plan p ORDER BY r.ord
        """,
        bucket=sql.ident(RateBucket._meta.db_table),
    )


def _reserve_rows(ordered: list[Member], *, now: float, max_wait: float) -> tuple[dict[str, float], float, bool] | None:
    """(each bucket's ready instant, the instant, taken?) — None when a row is missing."""
    params = {
        "names": [b.name for _, b in ordered],
        "rates": [float(b.rate) for _, b in ordered],
        "bursts": [float(b.burst) for _, b in ordered],
        "shared": [p is None for p, _ in ordered],
        "n": len(ordered),
        "now": float(now),
        "max_wait": float(max_wait) + EPSILON,
    }
    found = sql.execute(_bucket_reserve(), params)
    if len(found) < len(ordered):
        return None
    return {name: float(ready) for name, ready, _, _ in found}, float(found[0][2]), bool(found[0][3])


def tokens_acquire(*, portfolio_id: int, now: float, buckets: list[BucketConfig] | None = None) -> float:
    """Take a token from each of ``buckets`` (by default the portfolio's and the
    global one) now, or from none: 0.0 when taken, else the seconds until they
    will all be there."""
    buckets = buckets_for(portfolio_id) if buckets is None else buckets
    return tokens_reserve(members=[(None, b) for b in buckets], now=now, max_wait=0.0).wait


def tokens_give_back(*, portfolio_ids: set[int], include_global: bool = False, family: TokenFamily = DELETES) -> None:
    """Return the portfolio tokens a transaction took but did not use (the
    portfolios of partitions it left for the next one): a token pays for the
    batches of its own portfolio only. ``include_global``: the transaction
    touched no portfolio at all (or raised, or never ran), so its shared
    (global) token goes back too."""
    members: list[Member] = [(p, bucket) for p in sorted(portfolio_ids) for bucket in family.own(p)]
    if include_global:
        members += [(None, bucket) for bucket in family.shared()]
    buckets_give_back(members=members)


def _bucket_give_back_many() -> pg.Composed:
    """One token back into each named bucket, capped at its burst, the rows
    locked in the order given (a reservation's order). Parameters (named):
    ``names``, ``bursts``."""
    return sql.composed(
        """
        WITH back AS (
            SELECT b.name, w.burst, w.ord FROM {bucket} b
            JOIN unnest(%(names)s::text[], %(bursts)s::float8[]) WITH ORDINALITY AS w(name, burst, ord)
                ON w.name = b.name
            ORDER BY w.ord FOR UPDATE OF b
        )
        UPDATE {bucket} b SET tokens = LEAST(back.burst, b.tokens + 1) FROM back WHERE b.name = back.name
        """,
        bucket=sql.ident(RateBucket._meta.db_table),
    )


def buckets_give_back(*, members: list[Member]) -> None:
    """One token back into each bucket (capped at its burst), rows locked in
    ``_lock_order`` like a reservation's, so the two never deadlock. On a
    reserved bucket the token goes back at the reservation's instant."""
    ordered = _lock_order(members)
    if not ordered:
        return
    names, bursts = [b.name for _, b in ordered], [float(b.burst) for _, b in ordered]
    sql.execute(_bucket_give_back_many(), {"names": names, "bursts": bursts})


# The store's own Retry-After, shared by every worker: one 429 or 503 holds
# all purges until the instant it names, so the other workers defer their jobs
# (no attempt burned) instead of each collecting a 429 of its own. Kept as a
# bucket row whose ``updated_at`` is the instant; it only ever moves later.
DOCSTORE_HOLD = "docstore:retry-after"


def docstore_hold_until(*, until: float) -> None:
    with transaction.atomic():
        RateBucket.objects.bulk_create(
            [RateBucket(name=DOCSTORE_HOLD, tokens=0.0, updated_at=until)], ignore_conflicts=True
        )
        RateBucket.objects.filter(name=DOCSTORE_HOLD, updated_at__lt=until).update(updated_at=until)


def docstore_hold_remaining(*, now: float) -> float:
    """Seconds until the store's last Retry-After instant; 0 when none is pending."""
    until = RateBucket.objects.filter(name=DOCSTORE_HOLD).values_list("updated_at", flat=True).first()
    return max(0.0, until - now) if until is not None else 0.0
