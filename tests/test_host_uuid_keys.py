"""A host keyed by UUIDs throughout adopts the product by settings alone (issue 41, "Done when").

A project made by ``django-admin startproject`` whose every model is keyed by
``UUIDField(primary_key=True)`` — its user (``accounts.User``, an
``AbstractUser``, as ``AUTH_USER_MODEL``), its customer (``accounts.Customer``),
its site (``sites.Building``) and its record kind (``sites.WorkOrder``, whose
report is a ``FileField`` in an S3 bucket on moto's server) — installs the
wheel into a fresh virtualenv, and with docs/adopting.md's own settings
blocks and nothing else of the product's (no patch, no mirror tables of
integer-keyed customers or sites): ``check`` and ``migrate`` pass and the
product writes no migration; one user proposes a policy version and another
approves it; a hold is placed on one building; the sweep and the drain delete
the other building's expired work orders and their reports and keep the
young and the held ones with theirs. The product's own rows name the host's
keys in columns of the host's type (``uuid``); the batch's scope locks are
taken on the host's own customer and building tables (``cleanup_ops.sql``
names them, no other); the signed proof names the UUIDs as text and
verifies, and the ledger chain verifies; the console's, the API's and the
admin's pages of a UUID-keyed portfolio answer, a pause and a hold take its
UUID, and a key of the wrong type is a 400 or a 404.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from . import host_project
from .host_project import HOST_WORK_ORDERS, WHEEL_GROUP, Host, host_make, host_settings, wheel_python

wheel = host_project.wheel
bucket = host_project.bucket

UUID_MODELS = {
    "accounts": """
import uuid

from django.contrib.auth.models import AbstractUser
from django.db import models


class Keyed(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)

    class Meta:
        abstract = True


class User(AbstractUser):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)


class Customer(Keyed):
    title = models.CharField(max_length=100)

    def __str__(self):
        return f"customer {self.title}"
""",
    "sites": """
import uuid

from django.db import models


class Building(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    customer = models.ForeignKey("accounts.Customer", on_delete=models.PROTECT, related_name="buildings")
    street = models.CharField(max_length=100)

    def __str__(self):
        return self.street


class WorkOrder(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    customer = models.ForeignKey("accounts.Customer", on_delete=models.PROTECT, related_name="+")
    building = models.ForeignKey("sites.Building", on_delete=models.PROTECT, related_name="+", db_index=False)
    closed = models.DateTimeField()
    report = models.FileField(upload_to="reports/", blank=True)

    class Meta:
        indexes = [models.Index(fields=["building", "id"], include=["closed"], name="workorder_keyset_idx")]
""",
}

# Run inside the host project: the review, the hold, the sweep and the drain.
HOST_SWEEP = (
    HOST_WORK_ORDERS
    + """
import io
import json

from django.db import connection
from django.test import Client

from accounts.models import Customer, User
from cleanup_ops.models import CleanupJob, DeletedAttachment, LedgerEntry, PipelinePause, Sweep
from cleanup_ops.proof import proof_csv_sign, proof_sign, sweep_proof
from cleanup_ops.proof_keys import proof_public_keys
from cleanup_ops.proof_verify import verify, verify_text
from sites.models import Building, WorkOrder

assert get_user_model() is User
out = {"key_types": sorted({type(o.pk).__name__ for o in (customer, kept, held)})}
out["rows"] = {b.street: WorkOrder.objects.filter(building=b).count() for b in (kept, held)}
out["files"] = {b.street: len(reports.listdir(f"reports/{b.pk}")[1]) for b in (kept, held)}

# The batch's scope locks (FOR SHARE) are on the host's own tables, as the hold's (FOR UPDATE).
from cleanup_ops import sql
out["scope_tables"] = [sql.PORTFOLIO == Customer._meta.db_table, sql.PROPERTY == Building._meta.db_table,
                       sql.PORTFOLIO_KEY, sql.PROPERTY_KEY]

# The product's rows name the host's keys, in columns of the host's type.
with connection.cursor() as cur:
    cur.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns"
        " WHERE table_name LIKE 'cleanup_ops_%%' AND column_name IN ('portfolio_id', 'property_id')"
    )
    out["column_types"] = sorted({row[2] for row in cur.fetchall()})
jobs = CleanupJob.objects.filter(job_kind="delete")
out["jobs"] = sorted([str(j.property_id) == str(held.pk), j.outcome, j.rows_deleted] for j in jobs)
out["ledger"] = sorted([e.portfolio_id == customer.pk, e.property_id in (kept.pk, held.pk), e.rows_deleted]
                       for e in LedgerEntry.objects.all())
out["attachments"] = DeletedAttachment.objects.filter(portfolio_id=customer.pk, property_id=kept.pk).count()

# The signed proof: the UUIDs as text, and it verifies.
sweep = Sweep.objects.get()
document = json.loads(json.dumps(proof_sign(proof=sweep_proof(sweep=sweep))))
out["proof_keys"] = sorted({p["portfolio_id"] == str(customer.pk) for p in document["partitions"]})
keys = proof_public_keys()
csv_text = proof_csv_sign(proof=sweep_proof(sweep=sweep))
out["proof_verified"] = [verify(document, keys=keys).problems, verify_text(csv_text, keys=keys).problems]
call_command("cleanup_ledger_verify")

# The console and the API on the UUID-keyed portfolio, its jobs and its pause.
client = Client()
client.force_login(author)
out["portfolio_page"] = client.get(f"/ops/console/portfolios/{customer.pk}/").status_code
out["sweep_page"] = client.get(f"/ops/console/sweeps/{sweep.pk}/").status_code
out["proof_csv"] = client.get(f"/ops/console/sweeps/{sweep.pk}/proof.csv").status_code
out["jobs_api"] = sorted({j["portfolio_id"] for j in client.get("/ops/api/v1/jobs/").json()["results"]})
by_portfolio = client.get(f"/ops/api/v1/jobs/?portfolio={customer.pk}").json()
out["jobs_api_filtered"] = by_portfolio["count"]
out["jobs_api_bad_key"] = client.get("/ops/api/v1/jobs/?portfolio=7").status_code
out["jobs_page"] = client.get(f"/ops/console/jobs/?portfolio={customer.pk}").status_code
out["not_a_portfolio"] = client.get("/ops/console/portfolios/not-a-uuid/").status_code
# A pause of the UUID-keyed portfolio from the console's form, then its page and the audit log.
client.post("/ops/console/pause/", {"portfolio": str(customer.pk), "reason": "pausing globex for a store check"})
out["paused"] = PipelinePause.objects.active().filter(portfolio_id=customer.pk).count()
status = io.StringIO()
call_command("cleanup_status", "--json", stdout=status)
out["status_paused"] = [p["portfolio_id"] == str(customer.pk) for p in json.loads(status.getvalue())["paused"]]
out["pauses_page"] = [client.get("/ops/console/pauses/").status_code]
out["audit_page"] = client.get("/ops/console/audit/").status_code
# A hold placed through the API names the portfolio and the building by their UUIDs (JSON strings).
api_hold = client.post(
    "/ops/api/v1/legal-holds/",
    {"portfolio": str(customer.pk), "property": str(kept.pk), "reason": "a second dispute, about 2 Elm St"},
    content_type="application/json",
)
out["api_hold"] = [api_hold.status_code, api_hold.json().get("portfolio") == str(customer.pk)]
out["admin_holds"] = client.get(f"/admin/retention/legalhold/?portfolio__id__exact={customer.pk}").status_code
print("SWEEP", json.dumps(out))
"""
)


# The same host with string keys for its customers and sites (a CharField primary key).
UUID_KEY = "    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)"
STRING_KEY = "    id = models.CharField(primary_key=True, max_length=20, default=new_key, editable=False)"
NEW_KEY = 'def new_key():\n    return "k-" + uuid.uuid4().hex[:12]\n\n\n'
STRING_MODELS = {
    app: source.replace(
        f"class Keyed(models.Model):\n{UUID_KEY}", f"{NEW_KEY}class Keyed(models.Model):\n{STRING_KEY}"
    ).replace(f"class Building(models.Model):\n{UUID_KEY}", f"{NEW_KEY}class Building(models.Model):\n{STRING_KEY}")
    for app, source in UUID_MODELS.items()
}


def uuid_host(
    python: str, project: Path, *, database: dict[str, object], reports: dict[str, object], models: dict[str, str]
) -> None:
    """The host of ``models`` (UUID or string keys): docs/adopting.md's settings and URLs, its own user model."""
    settings = host_settings(database=database, reports=reports, extra='\nAUTH_USER_MODEL = "accounts.User"\n')
    host_make(python, project, apps=models, settings=settings)


@WHEEL_GROUP
def test_a_host_keyed_by_uuids_throughout_reviews_holds_sweeps_and_purges_by_settings_alone(
    wheel, host_database, bucket, tmp_path
):
    python = wheel_python(wheel)
    project = tmp_path / "host"
    project.mkdir()
    uuid_host(python, project, database=host_database, reports=bucket, models=UUID_MODELS)
    host = Host.installed(python, project, tmp_path)
    host.adopt("accounts", "sites")
    host.manage("createcachetable")

    out = json.loads(host.shell(HOST_SWEEP, "SWEEP"))
    assert out["key_types"] == ["UUID"]
    # The old work orders of the building under no hold go, and their reports
    # with them; the young ones and everything under the hold stay.
    assert out["rows"] == {"2 Elm St": 3, "3 Oak St": 8}
    assert out["files"] == {"2 Elm St": 3, "3 Oak St": 8}
    assert out["column_types"] == ["uuid"]
    assert out["scope_tables"] == [True, True, "uuid", "uuid"]
    assert out["jobs"] == [[False, "deleted", 5], [True, "held", 0]]
    assert out["ledger"] == [[True, True, 0], [True, True, 5]]
    assert out["attachments"] == 5
    assert out["proof_keys"] == [True]
    assert out["proof_verified"] == [[], []]
    assert out["portfolio_page"] == 200
    assert out["sweep_page"] == 200
    assert out["proof_csv"] == 200
    assert len(out["jobs_api"]) == 1
    assert out["jobs_api_filtered"] == 3  # two deletes and the purge
    assert out["jobs_api_bad_key"] == 400
    assert out["jobs_page"] == 200
    assert out["not_a_portfolio"] == 404
    assert out["paused"] == 1
    assert out["status_paused"] == [True]
    assert out["pauses_page"] == [200]
    assert out["audit_page"] == 200
    assert out["api_hold"] == [201, True]
    assert out["admin_holds"] == 200


def test_a_host_whose_customers_and_sites_have_string_keys_sweeps_and_purges_the_same(host_database, bucket, tmp_path):
    """The same host, its customers and buildings keyed by a ``CharField``
    (``k-…``), on the checkout in the suite's virtualenv (the wheel is the
    test above's): the columns are ``varchar``, the casts ``text``, and the
    review, the hold, the sweep, the drain, the proof and the pages behave
    as with UUIDs."""
    project = tmp_path / "host"
    project.mkdir()
    uuid_host(sys.executable, project, database=host_database, reports=bucket, models=STRING_MODELS)
    host = Host.checkout(sys.executable, project, tmp_path)
    host.adopt("accounts", "sites")
    out = json.loads(host.shell(HOST_SWEEP, "SWEEP"))
    assert out["key_types"] == ["str"]
    assert out["rows"] == {"2 Elm St": 3, "3 Oak St": 8}
    assert out["files"] == {"2 Elm St": 3, "3 Oak St": 8}
    assert out["column_types"] == ["character varying"]
    assert out["scope_tables"] == [True, True, "text", "text"]
    assert out["jobs"] == [[False, "deleted", 5], [True, "held", 0]]
    assert out["proof_verified"] == [[], []]
    assert [out["portfolio_page"], out["jobs_api_filtered"], out["paused"], out["api_hold"]] == [200, 3, 1, [201, True]]
    assert out["status_paused"] == [True]
