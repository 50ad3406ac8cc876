"""The defects a walk through the console and the admin found as a new user
of every role (issue 39, item 6), each with the test that shows it mended.
Browser-only ones (focus across a refresh, the reason kept across a CSRF
failure) are in ``test_console_defects_browser.py``."""

from __future__ import annotations

import pytest
from django.test import Client
from django.test.utils import CaptureQueriesContext

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter
from cleanup_ops.recovery.classification import DownstreamError
from cleanup_ops.schedule import sweep_trigger

from .conftest import make_records, make_user, utc

pytestmark = pytest.mark.django_db

OLD = utc("2020-01-01T00:00:00Z")
REASON = "the store is healthy again, retrying"


def reject(job_id: int) -> None:
    raise DownstreamError(400)


@pytest.fixture
def letter(portfolio, prop, active_policy) -> DeadLetter:  # type: ignore[no-untyped-def]
    """One open dead letter (the downstream answered 400)."""
    active_policy(portfolio, "lease", 365)
    make_records(prop, "lease", 2, ended=OLD)
    sweep_trigger()
    job_run_slice(job_id=CleanupJob.objects.get().pk, before_batch=reject)
    return DeadLetter.objects.get()


def logged_in(username: str, *roles: str, **client_options: bool) -> Client:
    client = Client(**client_options)
    client.force_login(make_user(username, *roles))
    return client


# --- 2. Error pages in the console's style ----------------------------------------------


def test_a_page_that_does_not_exist_answers_404_in_the_consoles_frame() -> None:
    client = logged_in("op", "operator")
    response = client.get("/console/jobs/999999/")
    assert response.status_code == 404
    html = response.content.decode()
    assert 'data-testid="not-found"' in html and "console/console.css" in html
    assert 'data-testid="where-to-go"' in html  # where the viewer's roles do lead
    assert "<h1>Not Found</h1>" not in html  # Django's bare page


def test_a_404_for_someone_logged_out_offers_the_login_page(client: Client) -> None:
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert 'data-testid="not-found"' in response.content.decode()
    assert 'href="/accounts/login/"' in response.content.decode()


def test_a_failed_csrf_check_answers_403_in_the_consoles_frame_without_debug_advice(letter) -> None:
    client = logged_in("op", "operator", enforce_csrf_checks=True)
    client.get("/console/dead-letters/")  # the form's page: a CSRF cookie is set
    response = client.post(
        "/console/dead-letters/action/",
        {"letter": letter.pk, "operation": "redrive", "reason": REASON, "step": "review"},
        HTTP_REFERER="http://testserver/console/dead-letters/",
    )
    assert response.status_code == 403
    html = response.content.decode()
    assert 'data-csrf-failure="true"' in html and "console/console.css" in html
    assert "DEBUG" not in html
    # Back to a fresh copy of the form (a fresh token), where console.js puts the reason back.
    assert 'href="http://testserver/console/dead-letters/" data-testid="csrf-back"' in html
    assert 'id="csrf-draft"' in html
    # The server echoes nothing of the (possibly forged) body.
    assert REASON not in html
    letter.refresh_from_db()
    assert letter.status == DeadLetter.Status.OPEN


def test_a_csrf_failure_never_links_back_to_another_site(letter) -> None:
    client = logged_in("op", "operator", enforce_csrf_checks=True)
    response = client.post("/console/dead-letters/action/", {"reason": REASON}, HTTP_REFERER="https://evil.example/")
    assert response.status_code == 403
    html = response.content.decode()
    assert "evil.example" not in html and 'href="/console/" data-testid="csrf-back"' in html


def test_the_500_page_renders_with_no_context_and_no_database_query(settings) -> None:
    from django.db import connection
    from django.test import RequestFactory
    from django.views.defaults import server_error

    settings.DEBUG = False
    with CaptureQueriesContext(connection) as queries:
        response = server_error(RequestFactory().get("/console/"))
    assert response.status_code == 500
    html = response.content.decode()
    assert 'data-testid="server-error"' in html and "console/console.css" in html
    assert "<h1>Server Error (500)</h1>" not in html
    assert len(queries) == 0


def test_a_view_that_raises_answers_the_consoles_500_page(settings) -> None:
    from unittest import mock

    client = logged_in("op", "operator", raise_request_exception=False)
    with mock.patch("cleanup_ops.views.workers.workers_overview", side_effect=RuntimeError("boom")):
        response = client.get("/console/workers/")
    assert response.status_code == 500
    assert 'data-testid="server-error"' in response.content.decode()


# --- 7. No row checkboxes without an action --------------------------------------------


def test_an_auditor_gets_no_row_checkboxes_on_the_dead_letter_inbox(letter) -> None:
    html = logged_in("audra", "auditor").get("/console/dead-letters/").content.decode()
    assert f'data-testid="letter-{letter.pk}"' in html
    assert 'type="checkbox"' not in html.split('id="live"', 1)[1]
    assert 'data-label="Select"' not in html


def test_an_operator_still_gets_a_checkbox_per_open_letter(letter) -> None:
    html = logged_in("op", "operator").get("/console/dead-letters/").content.decode()
    assert f'name="letter" value="{letter.pk}"' in html and 'data-testid="select-all-letters"' in html
