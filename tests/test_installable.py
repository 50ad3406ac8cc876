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

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from . import host_project
from .host_project import (
    HOST_MODELS,
    HOST_WORK_ORDERS,
    ROOT,
    WHEEL_GROUP,
    Host,
    host_make,
    host_settings,
    run,
    wheel_python,
)

wheel = host_project.wheel
bucket = host_project.bucket
TOOLING = ("bench/", "chaos/", "harness/", "tests/", "demo/", "config/", "properties/", "docstore/", "scripts/")


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
HOST_SWEEP = (
    HOST_WORK_ORDERS
    + """
import json

left = {b.street: WorkOrder.objects.filter(building=b).count() for b in (kept, held)}
files = {b.street: len(reports.listdir(f"reports/{b.pk}")[1]) for b in (kept, held)}
print("SWEEP", json.dumps({"rows": left, "files": files}))
"""
)


@WHEEL_GROUP
def test_a_host_project_with_its_own_customer_and_site_models_checks_migrates_and_serves_the_console(
    wheel, host_database, bucket, tmp_path
):
    python = wheel_python(wheel)
    project = tmp_path / "host"
    project.mkdir()
    host_make(python, project, apps=HOST_MODELS, settings=host_settings(database=host_database, reports=bucket))
    host = Host.installed(python, project, tmp_path)
    host.adopt("accounts", "sites")
    host.manage("createcachetable")

    answers = json.loads(host.shell(HOST_REQUESTS, "ANSWERS"))
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
    host.manage("shell", "-c", operator_perm + " g.permissions.remove(*p)")
    host.manage("migrate", "--noinput")
    again = host.manage("shell", "-c", operator_perm + " print('GRANTED', p.exists())")
    assert "GRANTED True" in again

    # The old work orders of the building under no hold go, and their reports
    # with them; the young ones and everything under the hold stay.
    assert json.loads(host.shell(HOST_SWEEP, "SWEEP")) == {
        "rows": {"2 Elm St": 3, "3 Oak St": 8},
        "files": {"2 Elm St": 3, "3 Oak St": 8},
    }


@WHEEL_GROUP
def test_a_host_project_missing_what_the_console_needs_is_told_the_line_to_add(wheel, tmp_path):
    python = wheel_python(wheel)
    project = tmp_path / "bare"
    project.mkdir()
    bare = textwrap.dedent(
        """
        INSTALLED_APPS += ["django_q", "accounts", "sites", "retention", "cleanup_ops"]
        RETENTION_PORTFOLIO_MODEL = "accounts.Customer"
        RETENTION_PROPERTY_MODEL = "sites.Building"
        RETENTION_PROPERTY_PORTFOLIO_FIELD = "street"
        CLEANUP_BATCH_SIZE = 5000
        """
    )
    host_make(python, project, apps=HOST_MODELS, settings=bare, name="bare", urls=False)
    env = Host.installed(python, project, tmp_path, name="bare").env
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
        (
            "CLEANUP_TABLE_PARTITION_PAUSE_RATIO",
            -1,
            "CLEANUP_TABLE_PARTITION_PAUSE_RATIO: must be a finite number >= 0.0",
        ),
        (
            "CLEANUP_TABLE_PARTITION_PAUSE_SECONDS",
            -1,
            "CLEANUP_TABLE_PARTITION_PAUSE_SECONDS: must be a finite number >= 0.0",
        ),
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
