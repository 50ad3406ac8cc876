"""The test database between committing tests (tests/conftest.py, "The migration's
rows, after a flush"): a flush leaves the database the migration made — every content
type, permission and role group with its grants, the reference guards in place — and
nothing for Django's ``post_migrate`` receivers to make again."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib.auth.management import create_permissions
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.management import create_contenttypes
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection
from psycopg import sql

from cleanup_ops.downstream.guard import guard_current, guarded_kinds, trigger_name
from properties.models import Portfolio
from retention.roles import sync_role_groups


def migration_state() -> dict[str, list[tuple[object, ...]]]:
    return {
        "content types": sorted(ContentType.objects.values_list("id", "app_label", "model")),
        "permissions": sorted(Permission.objects.values_list("id", "content_type_id", "codename", "name")),
        "groups": sorted(Group.objects.values_list("id", "name")),
        "grants": sorted(Group.permissions.through.objects.values_list("group_id", "permission_id")),
    }


def django_post_migrate_makes() -> None:
    """What Django's and the product's receivers would make on a ``migrate``."""
    for app_config in apps.get_app_configs():
        create_contenttypes(app_config, verbosity=0)
        create_permissions(app_config, verbosity=0)
    sync_role_groups(apps)


@pytest.mark.concurrency
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("reset_sequences", [False, True], ids=["sequences kept", "sequences reset"])
def test_a_flush_leaves_every_row_the_migration_made_and_nothing_for_post_migrate_to_make(
    reset_sequences: bool,
) -> None:
    before = migration_state()
    assert before["groups"] and before["grants"], "the migration made the role groups"
    # What a test might do to them, committed.
    Group.objects.filter(name="auditor").delete()
    Group.objects.create(name="made by a test")
    ContentType.objects.create(app_label="made_by", model="a_test")

    call_command("flush", interactive=False, verbosity=0, reset_sequences=reset_sequences)

    assert migration_state() == before
    django_post_migrate_makes()
    assert migration_state() == before, "post_migrate found something missing"
    # The identities continue after the rows put back: a new row takes a new id.
    assert Group.objects.create(name="new").id > max(id for id, _ in before["groups"])
    assert ContentType.objects.create(app_label="new", model="new").id > max(r[0] for r in before["content types"])


@pytest.mark.concurrency
@pytest.mark.django_db(transaction=True)
def test_a_flush_installs_again_a_reference_guard_a_test_dropped() -> None:
    spec = guarded_kinds()[0]
    with connection.cursor() as cur:
        cur.execute(
            sql.SQL("DROP TRIGGER {name} ON {table}").format(
                name=sql.Identifier(trigger_name(spec)), table=sql.Identifier(spec.table)
            )
        )
    with connection.cursor() as cur:
        assert not guard_current(spec, cur=cur)

    call_command("flush", interactive=False, verbosity=0, reset_sequences=False)

    with connection.cursor() as cur:
        assert all(guard_current(each, cur=cur) for each in guarded_kinds())


@pytest.mark.database
@pytest.mark.django_db
def test_a_flush_inside_a_tests_transaction_empties_what_that_transaction_wrote() -> None:
    """The probe of which tables hold rows runs on a connection of its own, which
    cannot see a transaction's uncommitted rows: inside one, Django's flush runs."""
    assert not Portfolio.objects.exists()  # no committed row: the probe would find the table empty
    Portfolio.objects.create(name="Uncommitted", slug="uncommitted")

    call_command("flush", interactive=False, verbosity=0, reset_sequences=False)

    assert not Portfolio.objects.exists()
    assert Group.objects.filter(name="operator").exists()
