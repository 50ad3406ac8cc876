"""The host projects of the adoption tests, built as docs/adopting.md tells an adopter.

A host is a project made by ``django-admin startproject`` with apps of its own
(``host_make``: their models, the page's settings and URLs, anything the test
adds), on the wheel in a fresh virtualenv (``wheel``, ``requirements_venv``) or
on this checkout (``Host.checkout``); ``Host.adopt`` takes the steps every
adoption takes — the host's migrations, ``check`` with no issue, ``migrate``,
and the product writing no migration of its own. ``HOST_WORK_ORDERS`` is the
script fragment of the hosts with customers and an S3 report storage: a policy
proposed and approved by two users, old and young work orders in two buildings,
a hold on one, the sweep and the drain. What each test then asserts is its own.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The wheel's tests on one pytest-xdist worker (--dist loadgroup): the wheel is built once
# (a module fixture is per worker), and the host projects reinstall it into the one
# shared virtualenv (requirements_venv), which two concurrent pip installs would tear.
WHEEL_GROUP = pytest.mark.xdist_group("installable")


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


@pytest.fixture
def bucket():
    """An S3 bucket on moto's server (real HTTP on loopback): the host's report storage."""
    from harness.s3 import S3Server, s3_client, storage_options

    with S3Server() as server:
        s3_client(server.endpoint).create_bucket(Bucket="host-reports")
        yield {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": storage_options(server.endpoint, "host-reports")}


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


def wheel_python(wheel: Path) -> str:
    """The interpreter of ``requirements_venv`` with ``wheel`` (re)installed in it."""
    python = venv_python(requirements_venv())
    run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", str(wheel)])
    return python


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


@dataclass(frozen=True)
class Host:
    """A host project on disk, its interpreter and the environment its commands run in."""

    python: str
    project: Path
    env: dict[str, str]

    @classmethod
    def checkout(cls, python: str, project: Path, home: Path, *, name: str = "host") -> Host:
        """The product's apps from this checkout, the host's own from its directory."""
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(home),
            "DJANGO_SETTINGS_MODULE": f"{name}.settings",
            "PYTHONPATH": f"{project}{os.pathsep}{ROOT}",
        }
        return cls(python, project, env)

    @classmethod
    def installed(cls, python: str, project: Path, home: Path, *, name: str = "host") -> Host:
        """Nothing of the repository on the path: only the wheel installed in ``python``'s virtualenv."""
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "DJANGO_SETTINGS_MODULE": f"{name}.settings"}
        return cls(python, project, env)

    def manage(self, *args: str) -> str:
        return run([self.python, "manage.py", *args], cwd=self.project, env=self.env)

    def shell(self, script: str, marker: str) -> str:
        """``manage.py shell -c script``; what it printed after ``marker`` (a JSON text, as the scripts print)."""
        return self.manage("shell", "-c", script).split(f"{marker} ", 1)[1]

    def adopt(self, *apps: str) -> None:
        """The host's migrations for ``apps``, ``check`` with no issue, ``migrate``; the product writes no migration."""
        self.manage("makemigrations", *apps)
        assert "System check identified no issues" in self.manage("check", "--fail-level", "WARNING")
        self.manage("migrate", "--noinput")
        # The product's migrations follow the host's models, their key types and its user model: nothing to write.
        self.manage("makemigrations", "--check", "--dry-run", "retention", "cleanup_ops")


def host_make(
    python: str, project: Path, *, apps: dict[str, str], settings: str, name: str = "host", urls: bool = True
) -> None:
    """``startproject name`` in ``project``, an app a key of ``apps`` with its ``models.py``, ``settings``
    appended to the project's own and (``urls``) docs/adopting.md's URLs."""
    run([python, "-m", "django", "startproject", name, str(project)])
    for app, models_py in apps.items():
        run([python, "-m", "django", "startapp", app], cwd=project)
        (project / app / "models.py").write_text(models_py.lstrip())
    settings_py = project / name / "settings.py"
    settings_py.write_text(settings_py.read_text() + settings)
    if urls:
        (project / name / "urls.py").write_text(HOST_URLS.lstrip())


def host_settings(*, database: dict[str, object], reports: dict[str, object] | None = None, extra: str = "") -> str:
    """The page's settings (``HOST_SETTINGS``) on ``database``, then ``extra``, then the report storage if any."""
    text = f"\nDATABASE = {database!r}\n" + textwrap.dedent(HOST_SETTINGS) + extra
    if reports is not None:
        text += "\nfrom django.conf import global_settings\n"
        text += f"STORAGES = {{**global_settings.STORAGES, 'reports': {reports!r}}}\n"
    return text


# Run inside a host with customers, buildings and S3 reports: the review by two users,
# old and young work orders in two buildings, a hold on one, the sweep and the drain.
# Leaves ``users``, ``author``, ``reviewer``, ``customer``, ``kept``, ``held``, ``now``
# and ``reports`` for what the test's script goes on with.
HOST_WORK_ORDERS = """
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
"""
