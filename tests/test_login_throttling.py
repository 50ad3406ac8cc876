"""Login throttling (django-axes) on the admin and console logins — issue 19, item 6.

Real login forms, real password checks: after ``LOGIN_FAILURE_LIMIT`` wrong
passwords the right one no longer logs in (429) until the cool-off has
passed; the platform's staff see the lockout in the admin and lift it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.test import Client

from .conftest import make_user

pytestmark = pytest.mark.django_db
PASSWORD = "pw-for-tests"
LOGINS = {"console": "/accounts/login/", "admin": "/admin/login/"}


def attempt(client: Client, path: str, username: str, password: str) -> int:
    return client.post(path, {"username": username, "password": password}).status_code


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.mark.parametrize("login", sorted(LOGINS))
def test_after_too_many_wrong_passwords_the_right_one_is_refused_until_the_cool_off_passes(
    login, settings, time_machine
):
    time_machine.move_to("2026-08-21T09:00:00Z", tick=False)
    settings.AXES_FAILURE_LIMIT = 3
    settings.AXES_COOLOFF_TIME = timedelta(minutes=15)
    make_user("target", "auditor")
    path = LOGINS[login]
    client = Client()
    for _ in range(2):
        assert attempt(client, path, "target", "wrong") == 200  # the form again, with its error
    assert attempt(client, path, "target", "wrong") == 429  # the third failure locks the username
    assert attempt(Client(), path, "target", PASSWORD) == 429  # right password, another client: still locked
    assert not logged_in(client)
    time_machine.move_to("2026-08-21T09:16:00Z", tick=False)
    fresh = Client()
    assert attempt(fresh, path, "target", PASSWORD) == 302
    assert logged_in(fresh)


def test_a_successful_login_resets_the_count(settings):
    settings.AXES_FAILURE_LIMIT = 3
    make_user("target", "auditor")
    client = Client()
    for _ in range(2):
        attempt(client, LOGINS["console"], "target", "wrong")
    assert attempt(client, LOGINS["console"], "target", PASSWORD) == 302
    for _ in range(2):
        assert attempt(Client(), LOGINS["console"], "target", "wrong") == 200
    assert attempt(Client(), LOGINS["console"], "target", PASSWORD) == 302


def test_the_platforms_staff_see_a_lockout_in_the_admin_and_lift_it(settings):
    settings.AXES_FAILURE_LIMIT = 2
    make_user("target", "auditor")
    for _ in range(2):
        attempt(Client(), LOGINS["admin"], "target", "wrong")
    assert AccessAttempt.objects.filter(username="target").exists()
    attempt_row = AccessAttempt.objects.get(username="target")
    assert "wrong" not in attempt_row.post_data  # the password is never stored

    auditor = Client()
    auditor.force_login(make_user("platform-auditor", "auditor"))
    listed = auditor.get("/admin/axes/accessattempt/")
    assert listed.status_code == 200 and "target" in listed.content.decode()
    assert auditor.post(f"/admin/axes/accessattempt/{attempt_row.pk}/delete/", {"post": "yes"}).status_code == 403

    operator = Client()
    operator.force_login(make_user("platform-operator", "operator"))
    response = operator.post(f"/admin/axes/accessattempt/{attempt_row.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert attempt(Client(), LOGINS["console"], "target", PASSWORD) == 302


def test_a_customers_staff_cannot_see_lockouts(estate_member):
    client = Client()
    client.force_login(estate_member)
    assert client.get("/admin/axes/accessattempt/").status_code == 403


@pytest.fixture
def estate_member(portfolio):  # type: ignore[no-untyped-def]
    from retention.services import membership_grant

    user = make_user("customer-auditor")
    membership_grant(user=user, portfolio=portfolio, role="auditor", granted_by=None)
    return user


def test_throttling_is_configured_from_the_environment():
    from tests.test_settings import start

    result = start(
        {"LOGIN_FAILURE_LIMIT": "0", "DEBUG": "true"},
    )
    assert result.returncode != 0 and "LOGIN_FAILURE_LIMIT:" in result.stderr
    result = start({"LOGIN_THROTTLE_ENABLED": "perhaps", "DEBUG": "true"})
    assert result.returncode != 0 and "LOGIN_THROTTLE_ENABLED:" in result.stderr
