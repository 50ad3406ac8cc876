"""Issue 39, "What does not hold" 2-4: the proof's status is the console's,
the API's bulk decision by filter carries the console's ``seen`` digest, the
reason rule counts visible characters by Unicode properties, and the API's
text and number fields are typed as JSON says."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from cleanup_ops.execution.runner import job_run_slice
from cleanup_ops.models import CleanupJob, DeadLetter, Sweep
from cleanup_ops.proof import sweep_proof
from retention.models import Membership

from . import test_console_recovery as recovery
from .conftest import make_user
from .test_console_recovery import REASON, bulk_confirm

pytestmark = pytest.mark.django_db

#: Three dead letters across two customers (Acme, Birch), all still open.
world = recovery.world


def member_api(portfolio, name: str) -> APIClient:  # type: ignore[no-untyped-def]
    user = make_user(name)
    Membership.objects.create(user=user, portfolio=portfolio, role="auditor")
    api = APIClient()
    api.force_authenticate(user)
    return api


# --- 2: the proof's status is the console's and the API's ----------------------------


def test_a_recovered_sweeps_proof_says_drained_for_a_customer_as_the_console_and_api_do(world, operator_user):
    op = Client()
    op.force_login(operator_user)
    form = bulk_confirm(op, "/console/dead-letters/all-matching/", {"operation": "redrive"})
    assert op.post("/console/dead-letters/all-matching/", {**form, "reason": REASON}).status_code == 302
    for job in CleanupJob.objects.filter(redrive_of__isnull=False):
        job_run_slice(job_id=job.pk)
    sweep = Sweep.objects.get()
    assert sweep.status == Sweep.Status.DRAINED
    for key in ("acme", "birch"):
        portfolio = world[key]
        # The customer's own jobs include the dead ones that were redriven.
        assert CleanupJob.objects.filter(sweep=sweep, portfolio_id=portfolio.pk, state="dead").exists()
        api = member_api(portfolio, f"aud-{key}")
        listed = api.get(f"/api/v1/sweeps/{sweep.pk}/").json()["status"]
        proof = api.get(f"/api/v1/sweeps/{sweep.pk}/proof/").json()["status"]
        scoped = sweep_proof(sweep=sweep, portfolio_ids=frozenset({portfolio.pk}))["status"]
        assert listed == proof == scoped == "drained", (key, listed, proof, scoped)
    assert sweep_proof(sweep=sweep)["status"] == "drained"
    assert DeadLetter.objects.filter(status="redriven").count() == 3


# --- 3: the API's bulk decision by filter carries the list's ``seen`` digest -----------


def test_the_apis_bulk_decision_by_filter_refuses_a_set_that_changed_behind_the_same_count(world, operator_user):
    api = APIClient()
    api.force_authenticate(operator_user)
    acme = world["acme"].pk
    listed = api.get("/api/v1/dead-letters/", {"status": "open", "portfolio": acme}).json()
    assert listed["count"] == 2 and len(listed["seen"]) == 64
    first, second = (row["id"] for row in sorted(listed["results"], key=lambda row: row["id"]))
    # Behind the caller's back, one letter is redriven and fails again: a new letter, the same count.
    job = api.post(f"/api/v1/dead-letters/{first}/redrive/", {"reason": REASON}, "json").json()
    job_run_slice(job_id=job["id"], before_batch=recovery.reject)
    new = DeadLetter.objects.get(job_id=job["id"])
    assert set(DeadLetter.objects.open().filter(portfolio_id=acme).values_list("id", flat=True)) == {second, new.pk}

    body = {"operation": "dismiss", "reason": REASON, "filter": {"portfolio": str(acme)}, "expected": 2}
    missing = api.post("/api/v1/dead-letters/bulk/", body, "json")
    assert missing.status_code == 400 and "seen" in missing.json(), missing.content
    stale = api.post("/api/v1/dead-letters/bulk/", {**body, "seen": listed["seen"]}, "json")
    assert stale.status_code == 409 and list(stale.json()) == ["seen"], stale.content
    assert DeadLetter.objects.get(pk=new.pk).status == "open"  # not dismissed unseen
    fewer = api.post("/api/v1/dead-letters/bulk/", {**body, "expected": 1, "seen": listed["seen"]}, "json")
    assert fewer.status_code == 409 and list(fewer.json()) == ["expected"], fewer.content
    malformed = api.post("/api/v1/dead-letters/bulk/", {**body, "seen": "x" * 64}, "json")
    assert malformed.status_code == 400 and "seen" in malformed.json()

    again = api.get("/api/v1/dead-letters/", {"status": "open", "portfolio": acme}).json()
    assert again["seen"] != listed["seen"] and again["count"] == 2
    done = api.post("/api/v1/dead-letters/bulk/", {**body, "seen": again["seen"]}, "json")
    assert done.status_code == 200, done.content
    assert sorted(done.json()["decided"]) == sorted([second, new.pk])


def test_the_lists_seen_is_the_consoles_digest_over_all_pages_and_the_schema_says_so(world, operator_user, monkeypatch):
    from cleanup_ops.api import SeenPagination
    from cleanup_ops.selectors import selection_digest

    monkeypatch.setattr(SeenPagination, "page_size", 2)
    api = APIClient()
    api.force_authenticate(operator_user)
    listed = api.get("/api/v1/dead-letters/", {"status": "open", "page": 2}).json()
    assert len(listed["results"]) == 1  # the last page; the digest is still over all three
    assert listed["seen"] == selection_digest(DeadLetter.objects.open().values_list("id", flat=True))
    op = Client()
    op.force_login(operator_user)
    page = op.get("/console/dead-letters/all-matching/", {"operation": "dismiss"})
    assert page.context["seen"] == listed["seen"]
    schema = api.get("/api/v1/schema/", {"format": "json"}).json()
    body = schema["components"]["schemas"]["BulkLetterDecisionRequest"]["properties"]
    assert body["seen"]["pattern"] == "^[0-9a-f]{64}$"
    paged = schema["components"]["schemas"]["PaginatedDeadLetterList"]
    assert "seen" in paged["properties"] and "seen" in paged["required"]


# --- 4: the reason rule counts visible characters by Unicode properties ----------------

NEVER_VISIBLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp", "Mn", "Mc", "Me"})


def invisible_code_points() -> list[str]:
    """Every code point the rule must not count, from unicodedata over the whole range."""
    import unicodedata

    from retention.inputs import default_ignorable

    blanks = {"\u2800", "\U0001d159"}  # graphic, but their reference glyph is empty
    return [
        ch
        for ch in map(chr, range(0x110000))
        if unicodedata.category(ch) in NEVER_VISIBLE or default_ignorable(ch) or ch in blanks
    ]


def test_no_invisible_code_point_counts_as_a_visible_character():
    from retention.inputs import reason_problem, visible_length

    table = invisible_code_points()
    assert {"\u3164", "\u115f", "\u1160", "\uffa0", "\u2800", "\U0001d159", "\u200b", "\u0301"} <= set(table)
    assert [f"U+{ord(ch):04X}" for ch in table if visible_length(ch * 10)] == []
    assert all(reason_problem("\U0001d159" * 10 + blank, field="reason") for blank in ("", " "))
    assert visible_length("e\u0301" * 10) == 10 == visible_length("\u00e9" * 10)  # a mark counts with its base
    assert reason_problem("subpoenas!", field="reason") is None


def test_the_default_ignorable_table_is_unicodes():
    import unicodedata

    import regex

    from retention.inputs import default_ignorable

    assigned = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) != "Cn"]
    # Unicode's table as the regex module has it, read in one pass over every assigned
    # code point (a single-character pattern: findall tests each position) rather than
    # one match call per code point, which took ten times as long.
    unicodes = set(regex.findall(r"\p{DI}", "".join(assigned)))
    differ = [ch for ch in assigned if default_ignorable(ch) != (ch in unicodes)]
    assert differ == []


@pytest.mark.parametrize("blank", ["\U0001d159", "\u2800", "\u3164", "\U000f0000", "\u0378"])
def test_every_reason_path_refuses_ten_invisible_characters(world, operator_user, reviewer, blank):
    from django.core.exceptions import ValidationError

    from cleanup_ops.recovery.operator import dead_letter_dismiss, dead_letter_redrive, pipeline_pause, pipeline_resume
    from retention.services import legal_hold_place, legal_hold_release

    reason = blank * 10
    letter = DeadLetter.objects.open().first()
    hold = legal_hold_place(portfolio=world["acme"], placed_by=reviewer, reason="litigation pending")
    pipeline_pause(actor=operator_user, reason="a proper reason here")
    attempts = {
        "pause": lambda: pipeline_pause(actor=operator_user, reason=reason, portfolio_id=world["birch"].pk),
        "resume": lambda: pipeline_resume(actor=operator_user, reason=reason),
        "hold": lambda: legal_hold_place(portfolio=world["acme"], placed_by=reviewer, reason=reason),
        "release": lambda: legal_hold_release(hold_id=hold.pk, released_by=reviewer, reason=reason),
        "redrive": lambda: dead_letter_redrive(letter_id=letter.pk, actor=operator_user, reason=reason),
        "dismiss": lambda: dead_letter_dismiss(letter_id=letter.pk, actor=operator_user, reason=reason),
    }
    for name, attempt in attempts.items():
        with pytest.raises(ValidationError):
            attempt()
        assert name
    api = APIClient()
    api.force_authenticate(operator_user)
    for path in ("/api/v1/pause/resume/", f"/api/v1/dead-letters/{letter.pk}/dismiss/"):
        response = api.post(path, {"reason": reason}, "json")
        assert response.status_code == 400 and "reason" in response.json(), (path, response.content)
    assert DeadLetter.objects.get(pk=letter.pk).status == "open"
