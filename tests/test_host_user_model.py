"""The product follows the host's own user model (issue 41, item 1).

A host project made by ``django-admin startproject`` whose ``AUTH_USER_MODEL``
is ``accounts.User`` (Django's ``AbstractUser`` keyed by a UUID), with the
product's apps from this checkout and the customer, site and record kind of
the wheel's host project (``tests/test_installable.py``), on a database of its
own: ``check`` and ``migrate`` pass and the product writes no migration; one
user proposes a policy version and another approves it, an operator pauses
and resumes the customer's portfolio (the pause's ``paused_by`` and
``resumed_by``), a membership is granted and revoked, and ``cleanup_redrive
--user`` finds its user. The memberships' audit details carry the user's UUID
as text, which the console's audit page names, and the audit filters (console
and API) take a UUID actor.

Unlike the wheel's tests it runs the checkout in the suite's own virtualenv:
what is under test is the product's reading of ``AUTH_USER_MODEL``, not its
packaging.
"""

from __future__ import annotations

import json
import sys

from .host_project import HOST_MODELS, Host, host_make, host_settings

UUID_USER = """


import uuid

from django.contrib.auth.models import AbstractUser


class User(AbstractUser):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
"""

HOST_USERS = """
import json
import uuid

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from accounts.models import Customer, User
from cleanup_ops.models import PipelinePause
from cleanup_ops.recovery.classification import FailureCategory
from cleanup_ops.recovery.operator import pipeline_pause, pipeline_resume
from retention.models import AuditEvent, PolicyVersion
from retention.services import (
    membership_grant, membership_revoke, policy_version_approve, policy_version_submit,
    retention_policy_get_or_create,
)

assert get_user_model() is User
users = User.objects
author = users.create_superuser("author", "a@example.com", "pw-123456789")
reviewer = users.create_superuser("reviewer", "r@example.com", "pw-123456789")
newcomer = users.create_user("newcomer", "n@example.com", "pw-123456789")
customer = Customer.objects.create(title="acme")
out = {"uuid_keys": all(isinstance(u.pk, uuid.UUID) for u in (author, reviewer, newcomer))}

policy = retention_policy_get_or_create(portfolio=customer, record_kind="work_order")
version = policy_version_submit(policy=policy, retention_days=30, author=author, reason="keep work orders a month")
policy_version_approve(version_id=version.pk, reviewer=reviewer, note="agreed: a month is enough")
version = PolicyVersion.objects.get(pk=version.pk)
out["version"] = [version.status, version.author_id == author.pk, version.reviewer_id == reviewer.pk]

pipeline_pause(actor=reviewer, reason="a broken store, pausing acme", portfolio_id=customer.pk)
pipeline_resume(actor=author, reason="the store is back, resuming acme", portfolio_id=customer.pk)
pause = PipelinePause.objects.get(portfolio_id=customer.pk)
out["pause"] = [pause.paused_by_id == reviewer.pk, pause.resumed_by_id == author.pk]

membership = membership_grant(user=newcomer, portfolio=customer, role="auditor", granted_by=author)
membership_revoke(membership_id=membership.pk, revoked_by=author)
events = AuditEvent.objects.filter(object_type="membership").order_by("id")
out["membership_events"] = [[e.action, e.details, e.actor_id == author.pk] for e in events]
out["newcomer"] = str(newcomer.pk)
out["customer"] = customer.pk

# No dead letter is open: the command only has to find its user (it fails naming --user otherwise).
call_command("cleanup_redrive", "--category", FailureCategory.values[0], "--reason", "nothing open yet, a dry try",
             "--user", "author", "--json")

client = Client()
client.force_login(author)
page = client.get("/ops/console/audit/?object_type=membership")
out["audit_page"] = [page.status_code, "user newcomer" in page.content.decode()]
by_actor = client.get(f"/ops/console/audit/?actor={reviewer.pk}")
out["audit_by_uuid"] = [by_actor.status_code, "policy_version.approved" in by_actor.content.decode(),
                        "membership.granted" in by_actor.content.decode()]
api = client.get(f"/ops/api/v1/audit-events/?actor={reviewer.pk}")
out["api_by_uuid"] = [api.status_code, sorted({e["actor"] for e in api.json()["results"]}) == [str(reviewer.pk)]]
pauses = client.get("/ops/console/pauses/")
out["pauses_page"] = [pauses.status_code, "reviewer" in pauses.content.decode()]
print("OUT", json.dumps(out))
"""


def test_a_host_with_a_uuid_keyed_user_model_migrates_reviews_pauses_and_audits_memberships(host_database, tmp_path):
    project = tmp_path / "host"
    project.mkdir()
    apps = {
        app: models_py.lstrip() + (UUID_USER if app == "accounts" else "") for app, models_py in HOST_MODELS.items()
    }
    reports = {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "r")}}
    extra = '\nAUTH_USER_MODEL = "accounts.User"\n'
    host_make(
        sys.executable, project, apps=apps, settings=host_settings(database=host_database, reports=reports, extra=extra)
    )
    # The host's user admin, as a host with its own user model has (the membership admin looks users up with it).
    (project / "accounts" / "admin.py").write_text(
        "from django.contrib import admin\nfrom django.contrib.auth.admin import UserAdmin\n\n"
        "from accounts.models import User\n\nadmin.site.register(User, UserAdmin)\n"
    )
    host = Host.checkout(sys.executable, project, tmp_path)
    # The product's migrations name the user model by the setting: nothing to write for this host.
    host.adopt("accounts", "sites")

    out = json.loads(host.shell(HOST_USERS, "OUT"))
    assert out["uuid_keys"] is True
    assert out["version"] == ["approved", True, True]
    assert out["pause"] == [True, True]
    # The user's id in the details is the UUID as text.
    details = {"portfolio_id": out["customer"], "user_id": out["newcomer"], "role": "auditor"}
    assert out["membership_events"] == [["membership.granted", details, True], ["membership.revoked", details, True]]
    assert out["audit_page"] == [200, True]
    assert out["audit_by_uuid"] == [200, True, False]
    assert out["api_by_uuid"] == [200, True]
    assert out["pauses_page"] == [200, True]
