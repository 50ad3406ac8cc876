"""Idle logins end; active ones last, but not past SESSION_COOKIE_AGE — issue 39, item 4.

``cleanup_ops.middleware.SessionIdleTimeout`` on the console and the admin:
idle past ``CONSOLE_SESSION_IDLE_SECONDS`` → the next request is logged out
(redirected to the login page); a request within it extends the session;
the console's live refresh (htmx) is checked but is not activity; and no
activity keeps a session past ``SESSION_COOKIE_AGE`` from its login.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client

from cleanup_ops.middleware import STAMP_EVERY_SECONDS, session_expired_reason

from .conftest import make_user, utc
from .test_settings import start

pytestmark = pytest.mark.django_db
START = utc("2026-03-02T09:00:00Z")
IDLE = 30 * 60  # the default


@pytest.fixture
def logged_in(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(START, tick=False)
    client = Client()
    client.force_login(make_user("idler", "operator"))
    assert client.get("/console/").status_code == 200  # the session's first request: its stamps
    return client


def login_redirect(response) -> bool:  # type: ignore[no-untyped-def]
    return response.status_code == 302 and "/login/" in response["Location"]


@pytest.mark.parametrize("path", ["/console/", "/admin/"])
def test_a_session_idle_past_the_bound_is_logged_out_on_its_next_request(logged_in, time_machine, path):
    time_machine.move_to(START + timedelta(seconds=IDLE + 1), tick=False)
    response = logged_in.get(path)
    assert login_redirect(response), (response.status_code, response.get("Location"))
    # Logged out for good: the session is gone, not merely refused once.
    assert "_auth_user_id" not in logged_in.session
    time_machine.move_to(START + timedelta(seconds=IDLE + 2), tick=False)
    assert login_redirect(logged_in.get("/console/"))


@pytest.mark.parametrize("path", ["/console/", "/admin/"])
def test_a_session_used_within_the_bound_stays_and_is_extended(logged_in, time_machine, path):
    at = START
    for _ in range(4):  # two hours in all, never idle for more than 25 minutes
        at += timedelta(minutes=25)
        time_machine.move_to(at, tick=False)
        assert logged_in.get(path).status_code == 200, at
    time_machine.move_to(at + timedelta(seconds=IDLE - STAMP_EVERY_SECONDS), tick=False)
    assert logged_in.get("/console/").status_code == 200


def test_the_live_refresh_is_not_activity(logged_in, time_machine):
    for minutes in (10, 20, 29):  # a tab left open: the live refresh polls
        time_machine.move_to(START + timedelta(minutes=minutes), tick=False)
        poll = logged_in.get("/console/", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="live")
        assert poll.status_code == 200
    time_machine.move_to(START + timedelta(seconds=IDLE + 1), tick=False)
    poll = logged_in.get("/console/", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="live")
    assert login_redirect(poll)  # console.js reloads the page into the login form


def test_no_activity_keeps_a_session_past_the_absolute_bound(logged_in, time_machine, settings):
    at = START
    while at < START + timedelta(seconds=settings.SESSION_COOKIE_AGE - 20 * 60):
        at += timedelta(minutes=20)
        time_machine.move_to(at, tick=False)
        assert logged_in.get("/console/").status_code == 200, at
    time_machine.move_to(START + timedelta(seconds=settings.SESSION_COOKIE_AGE + 1), tick=False)
    assert login_redirect(logged_in.get("/console/"))


def test_a_shorter_bound_from_the_settings_is_the_one_in_force(logged_in, time_machine, settings):
    settings.CONSOLE_SESSION_IDLE_SECONDS = 120
    time_machine.move_to(START + timedelta(seconds=100), tick=False)
    assert logged_in.get("/console/").status_code == 200
    time_machine.move_to(START + timedelta(seconds=100 + 121), tick=False)
    assert login_redirect(logged_in.get("/console/"))


def test_the_rule():
    assert session_expired_reason(started=0, active=0, now=IDLE, idle_seconds=IDLE, max_age=43200) is None
    assert session_expired_reason(started=0, active=0, now=IDLE + 1, idle_seconds=IDLE, max_age=43200) == "idle"
    assert session_expired_reason(started=0, active=43200, now=43201, idle_seconds=IDLE, max_age=43200) == "age"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("59", "CONSOLE_SESSION_IDLE_SECONDS: must be at least 60, got 59"),
        ("86401", "CONSOLE_SESSION_IDLE_SECONDS: must be at most 86400, got 86401"),
        ("half an hour", "CONSOLE_SESSION_IDLE_SECONDS: expected an integer, got 'half an hour'"),
        ("50000", "CONSOLE_SESSION_IDLE_SECONDS: must not exceed SESSION_COOKIE_AGE (43200), got 50000"),
    ],
)
def test_a_bad_bound_stops_start_up_naming_the_setting(value, message):
    result = start({"CONSOLE_SESSION_IDLE_SECONDS": value})
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-2000:]


def test_a_host_setting_a_bad_bound_fails_the_system_check(settings):
    settings.CONSOLE_SESSION_IDLE_SECONDS = 5
    with pytest.raises(SystemCheckError, match="CONSOLE_SESSION_IDLE_SECONDS: must be at least 60"):
        call_command("check")
    settings.CONSOLE_SESSION_IDLE_SECONDS = 3600
    settings.SESSION_COOKIE_AGE = 600
    with pytest.raises(SystemCheckError, match="CONSOLE_SESSION_IDLE_SECONDS: must not exceed SESSION_COOKIE_AGE"):
        call_command("check")
