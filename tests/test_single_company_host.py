"""A host with one company and no customer model (issue 41, item 3).

docs/adopting.md, "One company, no customer model": the host gives the
product a one-row ``sites.Company``, its ``Building``'s foreign key to it and
the same key on its record kind (``sites.WorkOrder``), each defaulting to
the one row — the page's own model and settings blocks, read from the page.
A project made by ``django-admin startproject`` with them passes ``check``
and ``migrate`` (the product writes no migration), the company's row is
created, a policy is proposed and approved by two users, a hold is placed on
one building, and the sweep and the drain delete the other building's
expired work orders and keep the young and the held ones. A hold on the
whole company then keeps every building's.

Like ``tests/test_host_user_model.py`` it runs the checkout in the suite's
virtualenv: what is under test is the product's reading of the settings.
"""

from __future__ import annotations

import json
import sys

from .host_project import Host, adopting_block, host_make, host_settings

SECTION = "3. Your customers and sites are your models"

# The page's Company and Building (its second python block of section 3), and a record kind of the host's.
SITES = (
    "from django.db import models\n\n\n"
    + adopting_block(SECTION, index=1)
    + """

class WorkOrder(models.Model):
    company = models.ForeignKey("sites.Company", on_delete=models.PROTECT, default=1, related_name="+")
    building = models.ForeignKey("sites.Building", on_delete=models.PROTECT, related_name="+", db_index=False)
    closed = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["building", "id"], include=["closed"], name="workorder_keyset_idx")]
"""
)

# The page's settings for one company (its third python block of section 3), after the
# page's general ones; the record kind names the company as its portfolio.
COMPANY_SETTINGS = (
    adopting_block(SECTION, index=2)
    + """
RETENTION_RECORD_KINDS = {
    "work_order": {"model": "sites.WorkOrder", "timestamp": "closed", "portfolio": "company", "property": "building"},
}
"""
)

HOST_SWEEP = """
import json
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from cleanup_ops.models import CleanupJob
from retention.services import (
    legal_hold_place, policy_version_approve, policy_version_submit, retention_policy_get_or_create,
)
from sites.models import Building, Company, WorkOrder

company, _ = Company.objects.get_or_create(pk=1)
users = get_user_model().objects
author = users.create_superuser("author", "a@example.com", "pw-123456789")
reviewer = users.create_superuser("reviewer", "r@example.com", "pw-123456789")
kept = Building.objects.create(street="2 Elm St")
held = Building.objects.create(street="3 Oak St")
now = timezone.now()
for building in (kept, held):
    for age in [400, 401, 402, 403, 404, 1, 1, 1]:
        WorkOrder.objects.create(building=building, closed=now - timedelta(days=age))
policy = retention_policy_get_or_create(portfolio=company, record_kind="work_order")
version = policy_version_submit(policy=policy, retention_days=30, author=author, reason="keep work orders a month")
policy_version_approve(version_id=version.pk, reviewer=reviewer, note="agreed: a month is enough")
legal_hold_place(portfolio=company, property=held, placed_by=reviewer, reason="a dispute about 3 Oak St")
call_command("cleanup_sweep")
call_command("cleanup_drain", "--max-seconds", "60")
out = {"first": {b.street: WorkOrder.objects.filter(building=b).count() for b in (kept, held)}}
out["defaults"] = [kept.company_id, WorkOrder.objects.values_list("company_id", flat=True).distinct().get()]
out["portfolios"] = sorted(set(CleanupJob.objects.values_list("portfolio_id", flat=True)))

# A hold on the whole company: the next sweep deletes nothing anywhere.
for building in (kept, held):
    WorkOrder.objects.create(building=building, closed=now - timedelta(days=500))
legal_hold_place(portfolio=company, placed_by=reviewer, reason="an audit of the whole company")
call_command("cleanup_sweep", "--slot", now.strftime("%Y-%m-%dT%H:%MZ"))
call_command("cleanup_drain", "--max-seconds", "60")
out["company_held"] = {b.street: WorkOrder.objects.filter(building=b).count() for b in (kept, held)}
print("OUT", json.dumps(out))
"""


def test_a_host_with_one_company_and_no_customer_model_is_one_portfolio_with_every_guarantee(host_database, tmp_path):
    project = tmp_path / "host"
    project.mkdir()
    apps = {"accounts": "from django.db import models\n", "sites": SITES}
    host_make(
        sys.executable, project, apps=apps, settings=host_settings(database=host_database, extra=COMPANY_SETTINGS)
    )
    host = Host.checkout(sys.executable, project, tmp_path)
    host.adopt("sites")

    out = json.loads(host.shell(HOST_SWEEP, "OUT"))
    # The old work orders of the building under no hold go; the young and the held ones stay.
    assert out["first"] == {"2 Elm St": 3, "3 Oak St": 8}
    # Every site and record is the one company's, by default; every job is of that one portfolio.
    assert out["defaults"] == [1, 1]
    assert out["portfolios"] == [1]
    # Under a hold of the whole company, the next sweep's expired rows stay in every building.
    assert out["company_held"] == {"2 Elm St": 4, "3 Oak St": 9}
