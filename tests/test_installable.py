"""The product installs from a wheel into a host project of its own.

``pip wheel`` of the repository builds a wheel of ``retention`` and
``cleanup_ops`` (templates, static files, migrations; no tooling, no demo).
Installed into a fresh virtualenv (the pinned requirements from PyPI, cached
under ``/tmp`` by the hash of ``requirements.txt``; the wheel itself is
reinstalled every run), a project made by ``django-admin startproject``
with its own customer and site models (``accounts.Customer``,
``sites.Building`` with a foreign key ``customer``, no ``name`` field) and
one record kind of its own (``sites.WorkOrder``)
passes ``check`` and ``migrate`` on PostgreSQL, writes no migration for the
product, and serves the console, its login, the API and ``/metrics`` under
``/ops/``.

It then runs a sweep and a drain over the host's own work orders: old rows
deleted, young and held rows kept, and each work order's report — a
``FileField`` in the host's own ``STORAGES["reports"]``, an S3 bucket on
moto's server — purged with its record: the files of deleted work orders
leave the bucket, those of young and held ones stay. The purge protocol on
every store is proved in ``tests/test_attachment_storages.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The wheel's tests on one pytest-xdist worker (--dist loadgroup): the wheel is built once
# (a module fixture is per worker), and the two host projects reinstall it into the one
# shared virtualenv (requirements_venv), which two concurrent pip installs would tear.
WHEEL_GROUP = pytest.mark.xdist_group("installable")
TOOLING = ("bench/", "chaos/", "harness/", "tests/", "demo/", "config/", "properties/", "docstore/", "scripts/")


def run(args: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: int = 900) -> str:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)  # noqa: S603
    assert result.returncode == 0, f"{' '.join(args)}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy: an in-tree build would leave build/ and *.egg-info in the checkout.
    source = tmp_path_factory.mktemp("source") / "repo"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".venv", "var", ".git", "build", "dist", "*.egg-info", "__pycache__", "node_modules"
        ),
    )
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", str(source), "-w", str(out)])
    (built,) = out.glob("*.whl")
    return built


@WHEEL_GROUP
def test_the_wheel_holds_the_two_apps_with_templates_static_files_and_migrations_and_no_tooling(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert packages == {"retention", "cleanup_ops"}
    for expected in (
        "retention/migrations/0001_initial.py",
        "cleanup_ops/migrations/0001_initial.py",
        "cleanup_ops/templates/console/base.html",
        "cleanup_ops/templates/console/login.html",
        "cleanup_ops/templates/cleanup_ops/redoc.html",
        "retention/templates/admin/retention/review_version.html",
        "retention/templates/admin/retention/retentionpolicy/change_form.html",
        "cleanup_ops/static/console/console.js",
        "cleanup_ops/static/console/console.css",
        "retention/static/retention/hold_property_picker.js",
        "cleanup_ops/management/commands/cleanup_sweep.py",
        "cleanup_ops/templatetags/console.py",
    ):
        assert expected in names
    assert [name for name in names if name.startswith(TOOLING)] == []


def test_the_demo_projects_url_check_is_the_apps_own():
    # config/settings.py imports no app, so it keeps a copy of the allowlist
    # check; both must accept and refuse the same URLs.
    from cleanup_ops.downstream.urls import docstore_url_check as app_check
    from config.urlcheck import docstore_url_check as demo_check

    assert (
        Path(ROOT / "config/urlcheck.py").read_text().split("def docstore_url_check", 1)[1]
        == (Path(ROOT / "cleanup_ops/downstream/urls.py").read_text().split("def docstore_url_check", 1)[1])
    )
    for url in ("http://127.0.0.1:9000/", "ftp://127.0.0.1/", "http://user:pw@localhost/", "http://evil.example/"):
        outcomes = []
        for check in (app_check, demo_check):
            try:
                outcomes.append(check(url, schemes=["http"], hosts=["127.0.0.1", "localhost"]))
            except ValueError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]


# --- a host project in a fresh virtualenv ---------------------------------------------


def requirements_venv() -> Path:
    """A virtualenv with requirements.txt installed, shared by runs with the same pins."""
    digest = hashlib.sha256((ROOT / "requirements.txt").read_bytes() + sys.version.encode()).hexdigest()[:16]
    venv = Path(tempfile.gettempdir()) / f"retention-host-venv-{digest}"
    if (venv / ".ready").exists():
        return venv
    building = Path(f"{venv}.{uuid.uuid4().hex[:8]}")
    run([sys.executable, "-m", "venv", str(building)])
    run([str(building / "bin/python"), "-m", "pip", "install", "--quiet", "-r", str(ROOT / "requirements.txt")])
    (building / ".ready").touch()
    try:
        building.rename(venv)
    except OSError:  # another run finished first: use that one
        shutil.rmtree(building, ignore_errors=True)
    return venv


def venv_python(venv: Path) -> str:
    # A venv moved after creation keeps its interpreter; scripts' shebangs do
    # not survive the move, so every tool runs as `python -m`.
    return str(venv / "bin/python")


def adopting_block(section: str, *, index: int = 0, language: str = "python") -> str:
    """The ``index``-th ``language`` code block of docs/adopting.md's section
    headed ``section`` (a ``##`` heading's text, up to the next ``##``): the host
    projects of the tests are built from what the page tells an adopter."""
    page = (ROOT / "docs/adopting.md").read_text()
    heading = re.search(rf"^## {re.escape(section)}\n", page, re.M)
    assert heading, f"docs/adopting.md has no section {section!r}"
    body = page[heading.end() :]
    following = re.search(r"^## ", body, re.M)
    body = body[: following.start()] if following else body
    blocks = re.findall(rf"^```{language}\n(.*?)^```", body, re.M | re.S)
    assert len(blocks) > index, f"docs/adopting.md, {section!r}: no {language} block {index}"
    return blocks[index]


# Where the page says "your own apps", the host's: its customer and site models' apps.
OWN_APPS = "    # ... your own apps, the ones holding your customer, site and record models ...\n"

# The page's settings (section 2) and the customer and site settings (section 3),
# verbatim but for the host's own apps; then what is this host's alone: its record
# kind, its database, its host name.
HOST_SETTINGS = (
    "\n# --- the retention cleanup console, as docs/adopting.md writes it ---\n"
    + adopting_block("2. Settings").replace(OWN_APPS, '    "accounts",\n    "sites",\n')
    + adopting_block("3. Your customers and sites are your models")
    + """
RETENTION_RECORD_KINDS = {
    "work_order": {
        "model": "sites.WorkOrder",
        "timestamp": "closed",
        "portfolio": "customer",
        "property": "building",
        "attachment": {"field": "report", "storage": "reports"},
    },
}
DATABASES = {"default": DATABASE}
ALLOWED_HOSTS = ["testserver"]
"""
)
assert '"accounts",' in HOST_SETTINGS, "docs/adopting.md's INSTALLED_APPS lost its line for the host's own apps"

HOST_MODELS = {
    "accounts": """
from django.db import models


class Customer(models.Model):
    title = models.CharField(max_length=100)

    def __str__(self):
        return f"customer {self.title}"
""",
    "sites": """
from django.db import models


class Building(models.Model):
    customer = models.ForeignKey("accounts.Customer", on_delete=models.PROTECT, related_name="buildings")
    street = models.CharField(max_length=100)

    def __str__(self):
        return self.street


class WorkOrder(models.Model):
    customer = models.ForeignKey("accounts.Customer", on_delete=models.PROTECT, related_name="+")
    building = models.ForeignKey("sites.Building", on_delete=models.PROTECT, related_name="+", db_index=False)
    closed = models.DateTimeField()
    report = models.FileField(upload_to="reports/", blank=True)

    class Meta:
        indexes = [models.Index(fields=["building", "id"], include=["closed"], name="workorder_keyset_idx")]
""",
}

HOST_URLS = adopting_block("4. URLs")

# Run inside the host project: the product's pages under /ops/, for a visitor
# and for a superuser, with a customer and a building of the host's own models.
HOST_REQUESTS = """
import json

from django.contrib.auth import get_user_model
from django.test import Client
from accounts.models import Customer
from sites.models import Building

customer = Customer.objects.create(title="acme")
Building.objects.create(customer=customer, street="1 Main St")
client = Client()
answers = {}
response = client.get("/ops/console/")
answers["console"] = (response.status_code, response.headers.get("Location", ""))
answers["login"] = client.get(answers["console"][1]).status_code
answers["metrics"] = client.get("/ops/metrics").status_code
answers["api"] = client.get("/ops/api/v1/").status_code
admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
client.force_login(admin)
answers["overview"] = client.get("/ops/console/").status_code
page = client.get(f"/ops/console/portfolios/{customer.pk}/")
answers["portfolio"] = (page.status_code, "customer acme" in page.content.decode())
answers["pauses"] = client.get("/ops/console/pauses/").status_code
answers["admin"] = client.get("/admin/").status_code
from django.contrib.auth.models import Group
answers["operator_sees_work_orders"] = Group.objects.get(name="operator").permissions.filter(
    content_type__app_label="sites", codename="view_workorder"
).exists()
print("ANSWERS", json.dumps(answers))
"""

# A sweep and a drain over the host's own records: a 30-day policy reviewed
# by two people, old and young work orders in two buildings, one building
# under a legal hold. The old ones of the other building go; the rest stay.
HOST_SWEEP = """
import json
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.core.management import call_command
from django.utils import timezone

from accounts.models import Customer
from retention.services import (
    legal_hold_place, policy_version_approve, policy_version_submit, retention_policy_get_or_create,
)
from sites.models import Building, WorkOrder

users = get_user_model().objects
author = users.create_superuser("author", "a@example.com", "pw-123456789")
reviewer = users.create_superuser("reviewer", "r@example.com", "pw-123456789")
customer = Customer.objects.create(title="globex")
kept = Building.objects.create(customer=customer, street="2 Elm St")
held = Building.objects.create(customer=customer, street="3 Oak St")
now = timezone.now()
reports = storages["reports"]
for building in (kept, held):
    for i, age in enumerate([400, 401, 402, 403, 404, 1, 1, 1]):
        name = reports.save(f"reports/{building.pk}/{i}.pdf", ContentFile(b"%PDF-1.4 work order"))
        WorkOrder.objects.create(customer=customer, building=building, closed=now - timedelta(days=age), report=name)
policy = retention_policy_get_or_create(portfolio=customer, record_kind="work_order")
version = policy_version_submit(policy=policy, retention_days=30, author=author, reason="keep work orders a month")
policy_version_approve(version_id=version.pk, reviewer=reviewer, note="agreed: a month is enough")
legal_hold_place(portfolio=customer, property=held, placed_by=reviewer, reason="a dispute about 3 Oak St")
call_command("cleanup_sweep")
call_command("cleanup_drain", "--max-seconds", "60")
left = {b.street: WorkOrder.objects.filter(building=b).count() for b in (kept, held)}
files = {b.street: len(reports.listdir(f"reports/{b.pk}")[1]) for b in (kept, held)}
print("SWEEP", json.dumps({"rows": left, "files": files}))
"""


@pytest.fixture
def bucket():
    """An S3 bucket on moto's server (real HTTP on loopback): the host's report storage."""
    from harness.s3 import S3Server, s3_client, storage_options

    with S3Server() as server:
        s3_client(server.endpoint).create_bucket(Bucket="host-reports")
        yield {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": storage_options(server.endpoint, "host-reports")}


@WHEEL_GROUP
def test_a_host_project_with_its_own_customer_and_site_models_checks_migrates_and_serves_the_console(
    wheel, host_database, bucket, tmp_path
):
    venv = requirements_venv()
    python = venv_python(venv)
    run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", str(wheel)])
    project = tmp_path / "host"
    project.mkdir()
    run([python, "-m", "django", "startproject", "host", str(project)])
    for app, models_py in HOST_MODELS.items():
        run([python, "manage.py", "startapp", app], cwd=project)
        (project / app / "models.py").write_text(models_py.lstrip())
    settings_py = project / "host" / "settings.py"
    settings_py.write_text(
        settings_py.read_text()
        + f"\nDATABASE = {host_database!r}\n"
        + textwrap.dedent(HOST_SETTINGS)
        + "\nfrom django.conf import global_settings\n"
        + f"STORAGES = {{**global_settings.STORAGES, 'reports': {bucket!r}}}\n"
    )
    (project / "host" / "urls.py").write_text(HOST_URLS.lstrip())
    # Nothing of the repository on the path: only the installed wheel.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "DJANGO_SETTINGS_MODULE": "host.settings"}
    manage = [python, "manage.py"]
    run([*manage, "makemigrations", "accounts", "sites"], cwd=project, env=env)

    checked = run([*manage, "check", "--fail-level", "WARNING"], cwd=project, env=env)
    assert "System check identified no issues" in checked
    run([*manage, "migrate", "--noinput"], cwd=project, env=env)
    # The product's migrations follow the host's models: nothing to write.
    run([*manage, "makemigrations", "--check", "--dry-run", "retention", "cleanup_ops"], cwd=project, env=env)
    run([*manage, "createcachetable"], cwd=project, env=env)

    printed = run([*manage, "shell", "-c", HOST_REQUESTS], cwd=project, env=env)
    answers = json.loads(printed.split("ANSWERS ", 1)[1])
    assert answers["console"] == [302, "/ops/accounts/login/?next=/ops/console/"]
    assert answers["login"] == 200
    assert answers["metrics"] in {401, 403}
    assert answers["api"] in {401, 403}
    assert answers["overview"] == 200
    assert answers["portfolio"] == [200, True]
    assert answers["pauses"] == 200
    assert answers["admin"] == 200
    # The host's record kind's view permission reached the platform roles at migrate.
    assert answers["operator_sees_work_orders"] is True

    # A kind added to the settings later writes no migration of ours: the next
    # migrate grants its view permission (taken away here to see it come back).
    operator_perm = (
        "from django.contrib.auth.models import Group; g = Group.objects.get(name='operator');"
        " p = g.permissions.filter(content_type__app_label='sites', codename='view_workorder');"
    )
    run([*manage, "shell", "-c", operator_perm + " g.permissions.remove(*p)"], cwd=project, env=env)
    run([*manage, "migrate", "--noinput"], cwd=project, env=env)
    again = run([*manage, "shell", "-c", operator_perm + " print('GRANTED', p.exists())"], cwd=project, env=env)
    assert "GRANTED True" in again

    printed = run([*manage, "shell", "-c", HOST_SWEEP], cwd=project, env=env)
    # The old work orders of the building under no hold go, and their reports
    # with them; the young ones and everything under the hold stay.
    assert json.loads(printed.split("SWEEP ", 1)[1]) == {
        "rows": {"2 Elm St": 3, "3 Oak St": 8},
        "files": {"2 Elm St": 3, "3 Oak St": 8},
    }


@WHEEL_GROUP
def test_a_host_project_missing_what_the_console_needs_is_told_the_line_to_add(wheel, tmp_path):
    venv = requirements_venv()
    python = venv_python(venv)
    run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", str(wheel)])
    project = tmp_path / "bare"
    project.mkdir()
    run([python, "-m", "django", "startproject", "bare", str(project)])
    for app, models_py in HOST_MODELS.items():
        run([python, "manage.py", "startapp", app], cwd=project)
        (project / app / "models.py").write_text(models_py.lstrip())
    settings_py = project / "bare" / "settings.py"
    settings_py.write_text(
        settings_py.read_text()
        + textwrap.dedent(
            """
            INSTALLED_APPS += ["django_q", "accounts", "sites", "retention", "cleanup_ops"]
            RETENTION_PORTFOLIO_MODEL = "accounts.Customer"
            RETENTION_PROPERTY_MODEL = "sites.Building"
            RETENTION_PROPERTY_PORTFOLIO_FIELD = "street"
            CLEANUP_BATCH_SIZE = 5000
            """
        )
    )
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "DJANGO_SETTINGS_MODULE": "bare.settings"}
    result = subprocess.run(  # noqa: S603
        [python, "manage.py", "check"], cwd=project, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "CLEANUP_BATCH_SIZE: must be at most 1000, got 5000" in out
    assert "RETENTION_PROPERTY_PORTFOLIO_FIELD: sites.Building has no foreign key 'street' to accounts.Customer" in out
    assert "Q_CLUSTER: django-q2's configuration must name the queue and the workers." in out
    assert "Add 'rest_framework' to INSTALLED_APPS." in out
    assert "Add 'retention.middleware.RefuseControlCharacters' to MIDDLEWARE." in out
    assert "Add 'retention.backends.MembershipBackend' to AUTHENTICATION_BACKENDS." in out
    assert "Set REST_FRAMEWORK['DEFAULT_AUTHENTICATION_CLASSES'] = ['knox.auth.TokenAuthentication', …]." in out
    assert "Replace 'django.contrib.admin' with 'retention.admin_site.GuardedAdminConfig' in INSTALLED_APPS." in out


# --- the apps' defaults and checks, in the demo project ---------------------------------


def test_each_apps_default_is_the_demo_projects_default():
    # The demo reads the same settings from the environment (config/settings.py);
    # with no variable set, both must give the same value.
    script = textwrap.dedent(
        """
        import django, json
        django.setup()
        from django.conf import settings
        from cleanup_ops.defaults import SETTINGS
        from retention.conf import RETENTION_SETTINGS
        wrong = {s.name: [repr(getattr(settings, s.name)), repr(s.default)]
                 for s in (*RETENTION_SETTINGS, *SETTINGS) if getattr(settings, s.name) != s.default}
        print("WRONG", json.dumps(wrong))
        """
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "SECRET_KEY": "x" * 50,
        "DEBUG": "true",
    }
    printed = run([sys.executable, "-c", script], cwd=ROOT, env=env)
    assert json.loads(printed.split("WRONG ", 1)[1]) == {}


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("CLEANUP_LEASE_JOBS", 0, "CLEANUP_LEASE_JOBS: must be at least 1, got 0"),
        ("CLEANUP_SLICE_SECONDS", "fast", "CLEANUP_SLICE_SECONDS: expected a number, got 'fast'"),
        ("CLEANUP_SCHEDULE", "every night", "CLEANUP_SCHEDULE: not a valid cron expression: 'every night'"),
        ("METRICS_ALLOWED_IPS", ["localhost"], "METRICS_ALLOWED_IPS: 'localhost' is not an IP address"),
        ("Q_BROKER", "kafka", "Q_BROKER: expected one of orm, redis, sqs, rabbitmq, got 'kafka'"),
        ("DOCSTORE_URL", "http://evil.example/", "DOCSTORE_URL: host 'evil.example' is not in DOCSTORE_ALLOWED_HOSTS"),
        ("DOCSTORE_READ_TIMEOUT", 59.0, "DOCSTORE_READ_TIMEOUT: connect + read timeout must stay under"),
        ("CLEANUP_LIVENESS_STALE_SECONDS", 6, "CLEANUP_LIVENESS_STALE_SECONDS: must exceed"),
    ],
)
def test_a_bad_pipeline_setting_is_a_system_check_error_naming_it(settings, name, value, message):
    from cleanup_ops.checks import pipeline_settings_check

    setattr(settings, name, value)
    errors = [error.msg for error in pipeline_settings_check()]
    assert any(error.startswith(message) for error in errors), errors


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RETENTION_PORTFOLIO_MODEL", "billing.Account", "RETENTION_PORTFOLIO_MODEL: 'billing.Account' is not a model"),
        ("RETENTION_PROPERTY_MODEL", "not a label", "RETENTION_PROPERTY_MODEL: expected a model label"),
        (
            "RETENTION_PROPERTY_PORTFOLIO_FIELD",
            "name",
            "RETENTION_PROPERTY_PORTFOLIO_FIELD: properties.Property has no foreign key 'name' to properties.Portfolio",
        ),
        ("CLEANUP_SCOPE_LOCK_WAIT_SECONDS", 0, "CLEANUP_SCOPE_LOCK_WAIT_SECONDS: must be a finite number >= 0.1"),
    ],
)
def test_a_bad_retention_setting_is_a_system_check_error_naming_it(settings, name, value, message):
    from retention.domain_checks import retention_settings_check

    setattr(settings, name, value)
    errors = [error.msg for error in retention_settings_check()]
    assert any(error.startswith(message) for error in errors), errors


def test_the_demo_project_passes_the_checks_of_what_the_console_needs():
    from cleanup_ops.checks import host_project_check, pipeline_settings_check
    from retention.domain_checks import retention_settings_check

    assert [*host_project_check(), *pipeline_settings_check(), *retention_settings_check()] == []


def test_a_project_without_the_guarded_admin_or_the_membership_backend_is_told_the_line_to_add(settings):
    from cleanup_ops.checks import host_project_check

    settings.AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]
    settings.LOGIN_URL = "/nowhere/"
    hints = [warning.hint for warning in host_project_check()]
    assert "Add 'retention.backends.MembershipBackend' to AUTHENTICATION_BACKENDS." in hints
    assert "Add 'axes.backends.AxesStandaloneBackend' to AUTHENTICATION_BACKENDS." in hints
    assert any(hint.startswith("Set LOGIN_URL = 'login'") for hint in hints)
