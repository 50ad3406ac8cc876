"""The demo document store, its client and its settings.

The store's own rate limit, the client refusing an id that is not an
identifier, start-up refusing a bad store setting, and the
``seed_attachments`` command. Separate from ``tests/test_downstream_purge.py``
(the purge path itself), whose world it shares (``tests/downstream_world.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from cleanup_ops.schedule import sweep_trigger
from properties.models import Lease

from . import downstream_world
from .conftest import make_records
from .downstream_world import NOW, OLD, SLOT

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.django_db

# The fixture the downstream modules share (tests/downstream_world.py).
clock = downstream_world.clock


class TestStoreAndSettings:
    def test_the_store_answers_429_with_retry_after_from_its_own_rate_limit(self, docstore_factory):
        from cleanup_ops.downstream.client import DocstoreClient
        from cleanup_ops.recovery.classification import DownstreamError

        store = docstore_factory("--rate", "1", "--burst", "1")
        store.create("a", "b")
        with DocstoreClient() as client:
            assert client.delete_document("a", idempotency_key="k-a") == "deleted"
            with pytest.raises(DownstreamError) as raised:
                client.delete_document("b", idempotency_key="k-b")
        assert raised.value.status == 429 and raised.value.retry_after == "1"
        assert [r["status"] for r in store.requests()] == [204, 429]

    def test_an_invalid_document_id_never_becomes_a_request(self, docstore):
        from cleanup_ops.downstream.client import DocstoreClient, InvalidDocumentId

        with DocstoreClient() as client:
            for bad in ["", "x" * 65, "../x", "a b", "http://127.0.0.1/", "a%2Fb", "a\nb"]:
                with pytest.raises(InvalidDocumentId):
                    client.delete_document(bad, idempotency_key="k")
        assert docstore.requests() == []

    @pytest.mark.parametrize(
        ("name", "value", "fragment"),
        [
            ("DOCSTORE_URL", "ftp://127.0.0.1/", "scheme 'ftp'"),
            ("DOCSTORE_URL", "http://docs.example.com/", "host 'docs.example.com'"),
            ("DOCSTORE_URL", "http://user:pw@127.0.0.1/", "credentials"),
            ("DOCSTORE_URL", "http://127.0.0.1:99999/", "not a valid URL"),
            ("DOCSTORE_URL", "http://127.0.0.1:8765/?next=http://x", "query"),
            ("DOCSTORE_READ_TIMEOUT", "120", "CLEANUP_LEASE_SECONDS"),
            ("DOCSTORE_RATE_GLOBAL", "fast", "expected a number"),
        ],
    )
    def test_a_bad_store_setting_stops_start_up_naming_the_variable(self, name, value, fragment):
        env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DEBUG"}}
        env.update({"DJANGO_SETTINGS_MODULE": "config.settings", "SECRET_KEY": "x" * 50, name: value})
        done = subprocess.run(
            [sys.executable, "-c", "import django; django.setup(); print('started')"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode != 0 and "started" not in done.stdout
        assert f"{name}: " in done.stderr and fragment in done.stderr

    def test_a_url_changed_at_run_time_is_checked_against_the_allowlist_again(self, settings):
        from cleanup_ops.downstream.client import DocstoreClient, DocstoreNotConfigured

        settings.DOCSTORE_URL = "http://203.0.113.7:8765"
        with pytest.raises(DocstoreNotConfigured, match="DOCSTORE_ALLOWED_HOSTS"):
            DocstoreClient()

    def test_seed_attachments_uploads_files_and_cleanup_drain_reports_the_purges(
        self, portfolio, prop, active_policy, clock, docstore
    ):
        active_policy(portfolio, "lease", 365)
        make_records(prop, "lease", 10, ended=OLD)
        out = StringIO()
        call_command("seed_attachments", "--fraction", "1", "--seed", "1", stdout=out)
        assert "Uploaded 10 attachments" in out.getvalue()
        assert docstore.documents() == set(Lease.objects.values_list("document_id", flat=True))
        sweep_trigger(slot=SLOT, now=NOW)
        out = StringIO()
        call_command("cleanup_drain", "--json", stdout=out)
        summary = json.loads(out.getvalue().strip().splitlines()[-1])
        assert summary["purges"]["documents_purged"] == 10
        assert summary["purges"]["purge_jobs_by_state"]["done"] == 1
        assert summary["jobs_by_outcome"]["purged"] == 1
        assert docstore.documents() == set()

    def test_seed_attachments_rejects_a_bad_fraction_naming_the_flag(self, docstore):
        from django.core.management.base import CommandError

        with pytest.raises(CommandError, match="--fraction"):
            call_command("seed_attachments", "--fraction", "2")
        assert not Lease.objects.exclude(document_id=None).exists()
