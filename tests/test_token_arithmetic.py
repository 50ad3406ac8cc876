"""The rate limiter's token arithmetic that runs in Python, without a database.

``cleanup_ops.ratelimit``: which buckets a job pays into (from the settings),
the one order every reservation locks them in, a reservation's waits (to
within ``EPSILON``), and how ``tokens_reserve`` turns the buckets' ready
instants into the portfolios allowed and each one's deferral. The refill
itself (a bucket's ready instant from its rate, burst and state) is computed
inside one SQL statement (``ratelimit._bucket_reserve``), so here its answer
is given: ``sql.execute`` is replaced by a stand-in that records what it was
asked and answers rows of the statement's shape. The refill is tested on
PostgreSQL in tests/test_rate_limits.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from cleanup_ops import ratelimit
from cleanup_ops.ratelimit import EPSILON, BucketConfig, Reservation

pytestmark = pytest.mark.unit

GLOBAL = BucketConfig("global", 5.0, 2.0)
P1 = BucketConfig("portfolio:1", 1.0, 1.0)
P2 = BucketConfig("portfolio:2", 1.0, 1.0)
P3 = BucketConfig("portfolio:3", 1.0, 1.0)


class Statement:
    """Stands in for ``sql.execute``: answers ``bucket_reserve`` with ``ready`` (name →
    instant), ``at`` and whether it took, and records each call's parameters."""

    def __init__(self, ready: dict[str, float], *, at: float, taken: bool) -> None:
        self.ready, self.at, self.taken = ready, at, taken
        self.calls: list[dict[str, Any]] = []

    def __call__(self, statement: str, params: dict[str, Any]) -> list[tuple[str, float, float, int]]:
        self.calls.append(params)
        taken = len(params["names"]) if self.taken else 0
        return [(name, self.ready[name], self.at, taken) for name in params["names"] if name in self.ready]


@pytest.fixture(autouse=True)
def no_runtime_limits(monkeypatch):  # type: ignore[no-untyped-def]
    """No operator has changed a limit at run time: the settings decide (and
    this unit tier reads no database for the overrides)."""
    monkeypatch.setattr(ratelimit, "runtime_limits", dict)


@pytest.fixture
def statement(monkeypatch):  # type: ignore[no-untyped-def]
    def answer(ready: dict[str, float], *, at: float, taken: bool = True) -> Statement:
        fake = Statement(ready, at=at, taken=taken)
        monkeypatch.setattr(ratelimit.sql, "execute", fake)
        return fake

    return answer


# --- Which buckets a job pays into ---------------------------------------------------


class TestBuckets:
    def test_a_delete_pays_into_its_portfolios_bucket_and_the_global_one(self, settings):
        settings.CLEANUP_RATE_PORTFOLIO, settings.CLEANUP_BURST_PORTFOLIO = 2.0, 3.0
        settings.CLEANUP_RATE_GLOBAL, settings.CLEANUP_BURST_GLOBAL = 10.0, 4.0
        assert ratelimit.buckets_for(7) == [BucketConfig("portfolio:7", 2.0, 3.0), BucketConfig("global", 10.0, 4.0)]

    def test_a_rate_of_zero_means_no_bucket(self, settings):
        settings.CLEANUP_RATE_PORTFOLIO = 0
        settings.CLEANUP_RATE_GLOBAL, settings.CLEANUP_BURST_GLOBAL = 10.0, 4.0
        assert ratelimit.buckets_for(7) == [BucketConfig("global", 10.0, 4.0)]
        settings.CLEANUP_RATE_GLOBAL = 0
        assert ratelimit.buckets_for(7) == []

    def test_a_purge_pays_into_the_stores_buckets_never_the_databases(self, settings):
        settings.DOCSTORE_RATE_PORTFOLIO, settings.DOCSTORE_BURST_PORTFOLIO = 1.0, 1.0
        settings.DOCSTORE_RATE_GLOBAL, settings.DOCSTORE_BURST_GLOBAL = 8.0, 2.0
        names = [bucket.name for bucket in ratelimit.docstore_buckets_for(7)]
        assert names == ["docstore:portfolio:7", "docstore:global"]
        assert not {bucket.name for bucket in ratelimit.docstore_buckets_for(7)} & {"portfolio:7", "global"}

    def test_the_store_with_no_rates_has_no_buckets(self, settings):
        settings.DOCSTORE_RATE_PORTFOLIO = settings.DOCSTORE_RATE_GLOBAL = 0
        assert ratelimit.docstore_buckets_for(7) == []


# --- The one lock order -----------------------------------------------------------------


class TestLockOrder:
    def test_portfolios_buckets_are_locked_by_portfolio_id_before_the_shared_ones(self):
        members = [(None, GLOBAL), (3, P3), (1, P1), (2, P2)]
        assert ratelimit._lock_order(members) == [(1, P1), (2, P2), (3, P3), (None, GLOBAL)]

    def test_shared_buckets_keep_the_order_given_with_the_global_one_last(self):
        store = BucketConfig("docstore:global", 1.0, 1.0)
        assert ratelimit._lock_order([(None, store), (None, GLOBAL)]) == [(None, store), (None, GLOBAL)]

    def test_two_buckets_of_one_portfolio_are_locked_by_name(self):
        a, b = BucketConfig("a:1", 1, 1), BucketConfig("b:1", 1, 1)
        assert ratelimit._lock_order([(1, b), (1, a)]) == [(1, a), (1, b)]

    def test_the_order_does_not_depend_on_the_order_asked_in(self):
        members = [(2, P2), (None, GLOBAL), (1, P1)]
        assert ratelimit._lock_order(members) == ratelimit._lock_order(list(reversed(members)))


# --- A reservation's waits -----------------------------------------------------------------


class TestReservationWaits:
    def test_a_reservation_due_now_waits_nothing(self):
        assert Reservation(now=100.0, at=100.0, reserved=True).wait == 0.0

    def test_a_reservation_for_later_waits_until_its_instant(self):
        assert Reservation(now=100.0, at=102.5, reserved=True).wait == 2.5

    def test_a_token_due_within_epsilon_counts_as_there(self):
        assert Reservation(now=100.0, at=100.0 + EPSILON / 2, reserved=True).wait == 0.0
        assert Reservation(now=100.0, at=100.0 + 10 * EPSILON, reserved=True).wait > 0.0

    def test_a_portfolio_waits_until_its_own_ready_instant(self):
        reservation = Reservation(now=100.0, at=101.0, reserved=True, ready={1: 101.0, 2: 104.0})
        assert (reservation.wait_of(1), reservation.wait_of(2)) == (1.0, 4.0)

    def test_a_portfolio_not_asked_about_waits_for_the_reservations_instant(self):
        assert Reservation(now=100.0, at=103.0, reserved=False).wait_of(9) == 3.0


# --- tokens_reserve: from the buckets' ready instants to who may go ------------------------


class TestTokensReserve:
    def test_with_no_buckets_every_portfolio_may_go_now_and_nothing_is_asked(self, statement):
        asked = statement({}, at=0.0)
        reservation = ratelimit.tokens_reserve(members=[], now=50.0, max_wait=0.0, portfolio_ids=[2, 1])
        assert reservation == Reservation(
            now=50.0, at=50.0, reserved=True, allowed=frozenset({1, 2}), ready={1: 50.0, 2: 50.0}
        )
        assert asked.calls == []

    def test_the_statement_gets_the_buckets_in_lock_order_and_the_wait_with_its_epsilon(self, statement):
        asked = statement({"portfolio:1": 10.0, "portfolio:2": 10.0, "global": 10.0}, at=10.0)
        ratelimit.tokens_reserve(members=[(None, GLOBAL), (2, P2), (1, P1)], now=10.0, max_wait=3.0)
        (params,) = asked.calls
        assert params["names"] == ["portfolio:1", "portfolio:2", "global"]
        assert params["shared"] == [False, False, True]
        assert params["rates"] == [1.0, 1.0, 5.0] and params["bursts"] == [1.0, 1.0, 2.0]
        assert params["n"] == 3 and params["now"] == 10.0 and params["max_wait"] == 3.0 + EPSILON

    def test_a_portfolio_is_ready_when_its_own_token_and_every_shared_one_are_there(self, statement):
        statement({"portfolio:1": 11.0, "portfolio:2": 14.0, "global": 12.0}, at=12.0)
        reservation = ratelimit.tokens_reserve(members=[(1, P1), (2, P2), (None, GLOBAL)], now=10.0, max_wait=5.0)
        assert reservation.ready == {1: 12.0, 2: 14.0}  # 1 waits for the global token, 2 for its own

    def test_only_the_portfolios_ready_by_the_reserved_instant_are_allowed(self, statement):
        statement({"portfolio:1": 11.0, "portfolio:2": 14.0, "global": 12.0}, at=12.0)
        reservation = ratelimit.tokens_reserve(members=[(1, P1), (2, P2), (None, GLOBAL)], now=10.0, max_wait=5.0)
        assert reservation.reserved and reservation.allowed == frozenset({1})
        assert (reservation.wait, reservation.wait_of(2)) == (2.0, 4.0)

    def test_a_refused_reservation_allows_no_portfolio_and_says_when_each_could_go(self, statement):
        statement({"portfolio:1": 11.0, "global": 30.0}, at=30.0, taken=False)
        reservation = ratelimit.tokens_reserve(members=[(1, P1), (None, GLOBAL)], now=10.0, max_wait=5.0)
        assert not reservation.reserved and reservation.allowed == frozenset()
        assert reservation.wait_of(1) == 20.0

    def test_a_portfolio_without_a_bucket_of_its_own_waits_only_for_the_shared_ones(self, statement):
        statement({"portfolio:1": 15.0, "global": 12.0}, at=12.0)
        reservation = ratelimit.tokens_reserve(
            members=[(1, P1), (None, GLOBAL)], now=10.0, max_wait=5.0, portfolio_ids=[1, 4]
        )
        assert reservation.ready == {1: 15.0, 4: 12.0} and reservation.allowed == frozenset({4})

    def test_shared_tokens_already_there_leave_a_portfolio_ready_no_earlier_than_now(self, statement):
        statement({"portfolio:1": 10.0, "global": 8.0}, at=10.0)
        reservation = ratelimit.tokens_reserve(members=[(1, P1), (None, GLOBAL)], now=10.0, max_wait=0.0)
        assert reservation.ready == {1: 10.0} and reservation.wait == 0.0

    def test_a_missing_bucket_is_made_full_and_the_reservation_asked_again(self, statement, monkeypatch):
        asked = statement({"global": 10.0}, at=10.0)
        made: list[list[tuple[str, float, float]]] = []
        rows_of = asked.__call__

        def first_without_rows(sql: str, params: dict[str, Any]) -> list[tuple[str, float, float, int]]:
            return [] if not made else rows_of(sql, params)

        monkeypatch.setattr(ratelimit.sql, "execute", first_without_rows)
        monkeypatch.setattr(
            ratelimit.RateBucket.objects,
            "bulk_create",
            lambda objs, ignore_conflicts: made.append([(o.name, o.tokens, o.updated_at) for o in objs]),
        )
        reservation = ratelimit.tokens_reserve(members=[(None, GLOBAL)], now=10.0, max_wait=0.0)
        assert made == [[("global", 2.0, 10.0)]]  # full: its burst, as of now
        assert reservation.reserved and reservation.at == 10.0

    def test_a_bucket_still_missing_after_it_was_made_is_an_error(self, statement, monkeypatch):
        statement({}, at=10.0)
        monkeypatch.setattr(ratelimit.RateBucket.objects, "bulk_create", lambda objs, ignore_conflicts: None)
        with pytest.raises(RuntimeError, match="could not be created"):
            ratelimit.tokens_reserve(members=[(None, GLOBAL)], now=10.0, max_wait=0.0)

    def test_taking_a_token_now_answers_zero_or_the_seconds_until_it_is_there(self, statement):
        statement({"global": 10.0}, at=10.0)
        assert ratelimit.tokens_acquire(portfolio_id=1, now=10.0, buckets=[GLOBAL]) == 0.0
        statement({"global": 10.4}, at=10.4, taken=False)
        assert ratelimit.tokens_acquire(portfolio_id=1, now=10.0, buckets=[GLOBAL]) == pytest.approx(0.4)

    def test_giving_back_with_no_limits_configured_touches_nothing(self, settings, monkeypatch):
        settings.CLEANUP_RATE_PORTFOLIO = settings.CLEANUP_RATE_GLOBAL = 0
        monkeypatch.setattr(ratelimit.sql, "execute", lambda *a: pytest.fail("a statement with nothing to give back"))
        ratelimit.tokens_give_back(portfolio_ids={1, 2}, include_global=True)

    def test_tokens_go_back_in_the_reservations_lock_order(self, settings, monkeypatch):
        settings.CLEANUP_RATE_PORTFOLIO, settings.CLEANUP_BURST_PORTFOLIO = 1.0, 1.0
        settings.CLEANUP_RATE_GLOBAL, settings.CLEANUP_BURST_GLOBAL = 5.0, 2.0
        calls: list[dict[str, Any]] = []
        monkeypatch.setattr(ratelimit.sql, "execute", lambda statement, params: calls.append(params))
        ratelimit.tokens_give_back(portfolio_ids={3, 1}, include_global=True)
        assert calls == [{"names": ["portfolio:1", "portfolio:3", "global"], "bursts": [1.0, 1.0, 2.0]}]
