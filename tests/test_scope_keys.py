"""The columns naming a host's customer or site follow its key type (``cleanup_ops.models.scope_keys``).

On the demo's integer keys nothing changes: the columns stay bigints, the
upgrade migration writes no statement, the statements cast to ``bigint``.
What a UUID or a string key gets (the check's verdict, the cast types, the
stripe of an advisory lock, a key as JSON, the proof's partition) is asserted
here on the functions that decide it; ``tests/test_host_uuid_keys.py`` runs a
whole UUID-keyed host.
"""

from __future__ import annotations

import io
import uuid

import pytest
from django.contrib.sessions.models import Session
from django.core.management import call_command
from django.db import connection
from django_q.models import Task
from knox.models import AuthToken

from cleanup_ops import sql
from cleanup_ops.execution.leases import lease_stripe
from cleanup_ops.models import CleanupJob, DeadLetter, DeletedAttachment, LedgerEntry, PipelinePause, PurgeRequest
from cleanup_ops.proof_verify import partition_of
from properties.models import Portfolio
from retention.domain import key_json, key_number, key_sql_type
from retention.domain_checks import key_type_errors
from retention.inputs import key_problem
from tests.schema_b.models import Ticket

SCOPE_MODELS = (CleanupJob, DeadLetter, DeletedAttachment, LedgerEntry, PipelinePause, PurgeRequest)


@pytest.mark.unit
def test_the_check_takes_integer_uuid_and_short_string_keys_and_refuses_a_longer_string():
    assert key_type_errors("RETENTION_PORTFOLIO_MODEL", Portfolio, 3) == []  # BigAutoField
    assert key_type_errors("RETENTION_PORTFOLIO_MODEL", Ticket, 3) == []  # UUIDField
    assert key_type_errors("RETENTION_PROPERTY_MODEL", Session, 4) == []  # CharField(max_length=40)
    assert key_type_errors("RETENTION_PROPERTY_MODEL", Task, 4) == []  # CharField(max_length=32)
    (error,) = key_type_errors("RETENTION_PROPERTY_MODEL", AuthToken, 4)  # CharField(max_length=128)
    assert error.id == "retention.E104"
    assert "knox.AuthToken's primary key 'digest' is not an integer, a UUID or a string of at most 40" in error.msg


@pytest.mark.unit
def test_each_key_type_has_its_cast_its_json_and_a_stable_stripe():
    assert [key_sql_type(m) for m in (Portfolio, Ticket, Session)] == ["bigint", "uuid", "text"]
    assert (sql.PORTFOLIO_KEY, sql.PROPERTY_KEY) == ("bigint", "bigint")  # the demo's
    key = uuid.UUID("0b5e3c1a-8f2d-4c6e-9a7b-1d2e3f405162")
    assert [key_json(7), key_json(key), key_json(None)] == [7, "0b5e3c1a-8f2d-4c6e-9a7b-1d2e3f405162", None]
    # An integer is its own number; any other key the first 63 bits of its text's SHA-256, the same in every process.
    assert key_number(12345) == 12345
    assert key_number(key) == key_number(str(key)) == 1139778097941464440
    assert 0 <= lease_stripe(key) < 32
    # A proof names a UUID property as its text, and an integer one in decimal, however the file spells it.
    assert partition_of({"property_id": str(key), "portfolio_id": 1}) == str(key)
    assert partition_of({"property_id": "42", "portfolio_id": 1}) == partition_of({"property_id": 42}) == "42"
    assert partition_of({"property_id": None, "portfolio_id": str(key)}) == f"portfolio-{key}"


@pytest.mark.unit
def test_a_key_of_the_wrong_type_is_refused_naming_the_field():
    assert key_problem("17", model=Portfolio, field="portfolio", from_form=True) is None
    assert key_problem("abc", model=Portfolio, field="portfolio", from_form=True) == (
        "portfolio must be an integer id (1 to 19 digits)."
    )
    assert key_problem(str(uuid.uuid4()), model=Ticket, field="portfolio", from_form=False) is None
    assert key_problem(17, model=Ticket, field="portfolio", from_form=False) == (
        "portfolio must be a UUID, not an integer."
    )
    assert key_problem("17", model=Ticket, field="portfolio", from_form=True) == "portfolio must be a UUID."


@pytest.mark.django_db
def test_on_integer_keys_the_columns_stay_bigints_and_the_upgrade_writes_no_statement():
    with connection.cursor() as cur:
        cur.execute(
            "SELECT DISTINCT data_type FROM information_schema.columns"
            " WHERE table_name = ANY(%s) AND column_name IN ('portfolio_id', 'property_id')",
            [[m._meta.db_table for m in SCOPE_MODELS]],
        )
        assert [row[0] for row in cur.fetchall()] == ["bigint"]
    out = io.StringIO()
    call_command("sqlmigrate", "cleanup_ops", "0024_scope_keys_follow_host_models", stdout=out)
    statements = [line for line in out.getvalue().splitlines() if line and not line.startswith("--")]
    assert statements == ["BEGIN;", "COMMIT;"]


@pytest.mark.django_db
def test_an_integer_keyed_installation_with_ledger_rows_migrates_through_0024_and_back_unchanged(
    portfolio, prop, active_policy, time_machine
):
    """An existing installation: jobs, ledger rows and a pause written on the
    bigint columns. Migrated back to 0023 and forward again, every row and
    column is as it was, and the ledger's chain still verifies (its hashes
    name the keys as text, which a bigint's type keeps)."""
    from django.db.migrations.executor import MigrationExecutor

    from cleanup_ops.ledger_chain import verify_chains
    from tests.test_ledger_chain import NOW, drained

    time_machine.move_to(NOW, tick=False)
    drained(portfolio, prop, active_policy)
    PipelinePause.objects.create(portfolio_id=portfolio.pk, reason="a pause before the upgrade", paused_at=NOW)

    def rows() -> list[list[object]]:
        return [sorted(m.objects.values_list("pk", "portfolio_id")) for m in SCOPE_MODELS]

    before = rows()
    assert before[LEDGER] and before[PAUSES]
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes("cleanup_ops")
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the fixture's deferred checks: ALTER TABLE refuses pending ones
    MigrationExecutor(connection).migrate([("cleanup_ops", "0023_api_tokens_to_knox")])
    MigrationExecutor(connection).migrate(latest)
    assert rows() == before
    assert verify_chains().ok


LEDGER = SCOPE_MODELS.index(LedgerEntry)
PAUSES = SCOPE_MODELS.index(PipelinePause)
