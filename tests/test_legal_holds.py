from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone
from psycopg.sql import SQL, Identifier

from properties.models import Lease, MaintenanceRecord, Property, TenantActivity
from retention.eligibility import count_expired_and_held, eligible_sql
from retention.models import AuditEvent, LegalHold
from retention.registry import get_spec
from retention.services import legal_hold_place, legal_hold_release

pytestmark = pytest.mark.django_db

OLD = timezone.now() - timedelta(days=1000)
CUTOFF = timezone.now() - timedelta(days=365)


@pytest.fixture
def world(portfolio, reviewer):
    """Two properties, each with old leases, maintenance records and activities."""
    other = Property.objects.create(portfolio=portfolio, name="Dockside")
    props = [Property.objects.create(portfolio=portfolio, name="Harbour House"), other]
    ids: dict[tuple[int, str], list[int]] = {}
    for p in props:
        common = {"portfolio": portfolio, "property": p}
        leases = [
            Lease.objects.create(**common, unit=f"{i}A", tenant_name="T", started_on=OLD.date(), ended_at=OLD)
            for i in range(3)
        ]
        records = [MaintenanceRecord.objects.create(**common, summary="x", opened_at=OLD, closed_at=OLD)]
        acts = [TenantActivity.objects.create(**common, activity_type="login", occurred_at=OLD) for _ in range(2)]
        ids[(p.pk, "lease")] = [r.pk for r in leases]
        ids[(p.pk, "maintenance_record")] = [r.pk for r in records]
        ids[(p.pk, "tenant_activity")] = [r.pk for r in acts]
    # A recent lease and a running one are never eligible.
    Lease.objects.create(portfolio=portfolio, property=props[0], unit="9", tenant_name="T", started_on=OLD.date())
    Lease.objects.create(
        portfolio=portfolio,
        property=props[0],
        unit="8",
        tenant_name="T",
        started_on=OLD.date(),
        ended_at=timezone.now(),
    )
    return props, ids


def eligible_ids(kind, *, cutoff, property_id):
    """Ids of one property's rows the eligibility predicate admits."""
    spec = get_spec(kind)
    predicate, params = eligible_sql(kind, cutoff=cutoff)
    with connection.cursor() as cursor:
        cursor.execute(
            SQL("SELECT r.{pk} FROM {table} r WHERE r.{property} = %s AND {predicate} ORDER BY r.{pk}").format(
                pk=Identifier(spec.pk_column),
                table=Identifier(spec.table),
                property=Identifier(spec.property_column),
                predicate=predicate,
            ),
            [property_id, *params],
        )
        return [row[0] for row in cursor.fetchall()]


def eligible_everywhere(props):
    return {(p.pk, kind): eligible_ids(kind, cutoff=CUTOFF, property_id=p.pk) for p in props for kind in KINDS}


KINDS = ["lease", "maintenance_record", "tenant_activity"]


def test_without_holds_exactly_the_rows_past_the_cutoff_are_eligible(world):
    props, ids = world
    assert eligible_everywhere(props) == ids


def test_a_portfolio_wide_hold_excludes_every_row_of_the_portfolio(world, portfolio, reviewer):
    props, _ = world
    legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason="litigation")
    assert all(v == [] for v in eligible_everywhere(props).values())


def test_a_property_hold_excludes_exactly_that_propertys_rows(world, portfolio, reviewer):
    props, ids = world
    legal_hold_place(portfolio=portfolio, property=props[0], placed_by=reviewer, reason="building dispute")
    result = eligible_everywhere(props)
    for (prop_id, kind), expected in ids.items():
        assert result[(prop_id, kind)] == ([] if prop_id == props[0].pk else expected)


def test_a_record_kind_hold_excludes_exactly_that_kind(world, portfolio, reviewer):
    props, ids = world
    legal_hold_place(
        portfolio=portfolio, record_kind="maintenance_record", placed_by=reviewer, reason="claim for the tests"
    )
    result = eligible_everywhere(props)
    for (prop_id, kind), expected in ids.items():
        assert result[(prop_id, kind)] == ([] if kind == "maintenance_record" else expected)


def test_a_property_and_kind_hold_excludes_only_their_intersection(world, portfolio, reviewer):
    props, ids = world
    legal_hold_place(
        portfolio=portfolio, property=props[1], record_kind="lease", placed_by=reviewer, reason="claim for the tests"
    )
    result = eligible_everywhere(props)
    for key, expected in ids.items():
        assert result[key] == ([] if key == (props[1].pk, "lease") else expected)


def test_a_single_record_hold_excludes_only_that_record_and_not_same_id_of_another_kind(world, portfolio, reviewer):
    props, ids = world
    target = ids[(props[0].pk, "lease")][1]
    legal_hold_place(
        portfolio=portfolio, record_kind="lease", record_id=target, placed_by=reviewer, reason="dispute for the tests"
    )
    result = eligible_everywhere(props)
    for key, expected in ids.items():
        if key == (props[0].pk, "lease"):
            assert result[key] == [i for i in expected if i != target]
        else:
            assert result[key] == expected


def test_a_hold_in_another_portfolio_excludes_nothing_here(world, reviewer):
    from properties.models import Portfolio

    props, ids = world
    other = Portfolio.objects.create(name="Other", slug="other")
    legal_hold_place(portfolio=other, placed_by=reviewer, reason="other customer")
    assert eligible_everywhere(props) == ids


def test_a_released_hold_excludes_nothing(world, portfolio, reviewer):
    props, ids = world
    hold = legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason="litigation")
    legal_hold_release(hold_id=hold.pk, released_by=reviewer, reason="case settled")
    assert eligible_everywhere(props) == ids
    actions = list(AuditEvent.objects.order_by("id").values_list("action", flat=True))
    assert actions[-2:] == ["legal_hold.placed", "legal_hold.released"]


def test_counts_report_expired_and_held_rows(world, portfolio, reviewer):
    props, _ = world
    legal_hold_place(portfolio=portfolio, property=props[0], placed_by=reviewer, reason="dispute for the tests")
    assert count_expired_and_held("lease", cutoff=CUTOFF, portfolio_id=portfolio.pk) == (6, 3)
    assert count_expired_and_held("lease", cutoff=CUTOFF, property_id=props[1].pk) == (3, 0)


def test_a_blank_hold_reason_is_refused_and_nothing_is_written(portfolio, reviewer):
    with pytest.raises(ValidationError) as info:
        legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason="  ")
    assert "reason" in info.value.message_dict
    assert not LegalHold.objects.exists()
    assert not AuditEvent.objects.exists()


def test_an_unknown_record_kind_on_a_hold_is_refused(portfolio, reviewer):
    with pytest.raises(ValidationError) as info:
        legal_hold_place(portfolio=portfolio, record_kind="invoice", placed_by=reviewer, reason="x for the tests")
    assert "record_kind" in info.value.message_dict
    assert not LegalHold.objects.exists()


def test_a_record_hold_without_a_kind_is_refused(portfolio, reviewer):
    with pytest.raises(ValidationError) as info:
        legal_hold_place(portfolio=portfolio, record_id=5, placed_by=reviewer, reason="x for the tests")
    assert "record_kind" in info.value.message_dict


def test_a_property_from_another_portfolio_is_refused(portfolio, reviewer):
    from properties.models import Portfolio

    other = Portfolio.objects.create(name="Other", slug="other")
    foreign = Property.objects.create(portfolio=other, name="Elsewhere")
    with pytest.raises(ValidationError) as info:
        legal_hold_place(portfolio=portfolio, property=foreign, placed_by=reviewer, reason="x for the tests")
    assert "property" in info.value.message_dict


def test_release_needs_a_reason_and_cannot_happen_twice(portfolio, reviewer):
    hold = legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason="litigation")
    with pytest.raises(ValidationError) as info:
        legal_hold_release(hold_id=hold.pk, released_by=reviewer, reason="")
    assert "reason" in info.value.message_dict
    hold.refresh_from_db()
    assert hold.is_active
    legal_hold_release(hold_id=hold.pk, released_by=reviewer, reason="settled for the tests")
    with pytest.raises(ValidationError, match="already released"):
        legal_hold_release(hold_id=hold.pk, released_by=reviewer, reason="again for the tests")


class TestRecordHoldScope:
    """A record-level hold names a record that exists, of its kind, in its portfolio (and property)."""

    @pytest.fixture
    def other_scope(self, portfolio):
        from properties.models import Portfolio

        other = Portfolio.objects.create(name="Other", slug="other")
        elsewhere = Property.objects.create(portfolio=other, name="Elsewhere")
        lease = Lease.objects.create(
            portfolio=other, property=elsewhere, unit="1", tenant_name="T", started_on=OLD.date(), ended_at=OLD
        )
        return other, lease

    def test_a_hold_on_an_existing_record_of_its_portfolio_and_property_is_placed(self, world, portfolio, reviewer):
        props, ids = world
        target = ids[(props[1].pk, "lease")][0]
        scope = {"portfolio": portfolio, "property": props[1], "record_kind": "lease", "record_id": target}
        hold = legal_hold_place(**scope, placed_by=reviewer, reason="dispute for the tests")
        assert (hold.record_kind, hold.record_id) == ("lease", target)

    @pytest.mark.parametrize("case", ["no_such_id", "other_kind", "other_portfolio", "other_property"])
    def test_a_record_that_is_not_there_is_refused_naming_record_id_and_nothing_is_written(
        self, world, portfolio, reviewer, other_scope, case
    ):
        props, ids = world
        _, foreign_lease = other_scope
        activity = ids[(props[0].pk, "tenant_activity")][0]
        kwargs = {
            # An id no lease has.
            "no_such_id": {"record_kind": "lease", "record_id": 10**9},
            # A tenant activity's id, named as a maintenance record (a kind with no row of that id).
            "other_kind": {"record_kind": "maintenance_record", "record_id": _id_not_in(MaintenanceRecord, activity)},
            # A lease that exists, in another customer's portfolio.
            "other_portfolio": {"record_kind": "lease", "record_id": foreign_lease.pk},
            # A lease of this portfolio, in the other property than the one named.
            "other_property": {
                "property": props[0],
                "record_kind": "lease",
                "record_id": ids[(props[1].pk, "lease")][0],
            },
        }[case]
        with pytest.raises(ValidationError) as info:
            legal_hold_place(portfolio=portfolio, placed_by=reviewer, reason="dispute for the tests", **kwargs)
        assert list(info.value.message_dict) == ["record_id"]
        message = info.value.message_dict["record_id"][0]
        assert f"id {kwargs['record_id']} in portfolio {portfolio.pk}" in message
        # The same words whether the id exists elsewhere or not at all.
        assert "Other" not in message and "another" not in message
        assert not LegalHold.objects.exists() and not AuditEvent.objects.exists()

    def test_the_api_answers_400_naming_record_id(self, world, portfolio, reviewer, other_scope):
        from rest_framework.test import APIClient

        _, foreign_lease = other_scope
        client = APIClient()
        client.force_authenticate(reviewer)
        body = {
            "portfolio": portfolio.pk,
            "record_kind": "lease",
            "record_id": foreign_lease.pk,
            "reason": "dispute over the deposit",
        }
        response = client.post("/api/v1/legal-holds/", body, format="json")
        assert response.status_code == 400 and list(response.json()) == ["record_id"]
        assert not LegalHold.objects.exists()

    def test_the_admin_shows_the_error_on_the_record_id_field(self, client, world, portfolio, reviewer):
        from django.urls import reverse

        client.force_login(reviewer)
        form = {
            "portfolio": portfolio.pk,
            "record_kind": "lease",
            "record_id": 10**9,
            "reason": "dispute over the deposit",
        }
        response = client.post(reverse("admin:retention_legalhold_add"), form)
        assert response.status_code == 200
        assert "record_id" in response.context["adminform"].form.errors
        assert not LegalHold.objects.exists()

    def test_a_record_deleted_between_the_admin_forms_check_and_the_placement_is_shown_not_a_500(
        self, client, world, portfolio, reviewer, monkeypatch
    ):
        from django.urls import reverse

        from retention import admin_forms as retention_admin

        props, ids = world
        target = ids[(props[0].pk, "lease")][0]
        Lease.objects.filter(pk=target).delete()  # a batch deleted it after the form's check (below) passed
        real_check = retention_admin.legal_hold_scope_validate
        calls: list[int] = []

        def checked_before_the_delete(**kwargs: object) -> None:
            calls.append(1)
            if len(calls) > 1:
                real_check(**kwargs)

        monkeypatch.setattr(retention_admin, "legal_hold_scope_validate", checked_before_the_delete)
        client.force_login(reviewer)
        form = {
            "portfolio": portfolio.pk,
            "record_kind": "lease",
            "record_id": target,
            "reason": "dispute over the deposit",
        }
        response = client.post(reverse("admin:retention_legalhold_add"), form)
        assert response.status_code == 200
        assert "record_id" in response.context["adminform"].form.errors
        assert not LegalHold.objects.exists()


def _id_not_in(model, start: int) -> int:  # type: ignore[no-untyped-def]
    """``start``, or the next id after it that ``model`` has no row for."""
    taken = set(model.objects.values_list("id", flat=True))
    while start in taken:
        start += 1
    return start
