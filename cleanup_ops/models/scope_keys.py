"""The pipeline's columns naming a host's customer or site: keys of the host's own type.

A job, a ledger row, a dead letter, a pause, a purge request and a deleted
attachment each name the portfolio (``RETENTION_PORTFOLIO_MODEL``) and, but
for a kind without a property, the property (``RETENTION_PROPERTY_MODEL``)
they are about. ``ScopeKey`` is a ``ForeignKey`` to that model with no
database constraint and no reverse relation: the column takes the type of
the model's primary key — an integer, a UUID, a string — so the batch's
statements join it to the host's rows and lock *those* rows (``FOR SHARE``
/ ``FOR UPDATE``) without a cast or a mirror, while the row outlives what it
names (the job of a deleted site still says so: outcome ``scope_missing``;
the ledger keeps its history). ``on_delete=DO_NOTHING``: the host deleting a
customer never touches the product's rows.

One exception to "the target's type": any integer key (``AutoField``,
``IntegerField``, ``SmallAutoField``…) is kept in a ``bigint`` column, as
these columns always were, so an installation upgrading from the integer
columns alters nothing (migration ``0024_scope_keys_follow_host_models``
is then a no-op) and a 32-bit key fits as it did.

No index of its own (``db_index=False``): every lookup these rows need is
served by the composite indexes their models declare.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.migrations.operations.base import Operation
from psycopg import sql as pg

INTEGER_KEYS = (models.AutoField, models.IntegerField)  # IntegerField covers Big/Small/Positive…


if TYPE_CHECKING:
    # A key of any type, possibly NULL (django-stubs' generic parameters: set, get).
    _ForeignKey = models.ForeignKey[Any, Any]
else:
    _ForeignKey = models.ForeignKey


class ScopeKey(_ForeignKey):
    """A host customer's or site's key, of the key's own type (module docstring)."""

    def __init__(self, to: Any, **kwargs: Any) -> None:
        kwargs.setdefault("on_delete", models.DO_NOTHING)
        kwargs.setdefault("db_constraint", False)
        kwargs.setdefault("db_index", False)
        kwargs.setdefault("related_name", "+")
        super().__init__(to, **kwargs)

    def db_type(self, connection: Any) -> str | None:
        if isinstance(self.target_field, INTEGER_KEYS):
            return "bigint"
        return super().db_type(connection)


class FollowScopeKeyTypes(Operation):
    """The database half of turning ``BigIntegerField`` columns into ``ScopeKey``s
    (migration ``0024_scope_keys_follow_host_models``, after its state half: a
    ``RemoveField`` and an ``AddField`` per column, the column keeping its
    name). Each column of ``fields`` ((model, field name) pairs) takes the
    type its ``ScopeKey`` has in the migration's state: ``bigint`` for an
    integer key, which changes nothing (no statement at all), else the key's
    own type, one ``ALTER TABLE`` per table. Django's own ``AlterField``
    cannot do it: it casts ``bigint`` to ``uuid`` directly, which PostgreSQL
    refuses; this casts through text (a fresh installation's tables are
    empty; an integer-keyed one never reaches the cast). Backwards, the
    columns become ``bigint`` again (a UUID installation's rows cannot)."""

    reduces_to_sql = True
    reversible = True

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        self.fields = fields

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (self.__class__.__qualname__, [], {"fields": self.fields})

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass  # the state's fields are the RemoveField/AddField before it (a SeparateDatabaseAndState)

    def describe(self) -> str:
        return "Give the portfolio and property key columns the host models' key types"

    def _alter(self, app_label: str, schema_editor: Any, state: Any, *, to_bigint: bool) -> None:
        """``state``: the one holding the ``ScopeKey``s (after the migration)."""
        connection = schema_editor.connection
        by_table: dict[str, list[tuple[str, str]]] = {}
        for model_name, name in self.fields:
            model = state.apps.get_model(app_label, model_name)
            field = model._meta.get_field(name)
            key_type = field.db_type(connection)
            if key_type != "bigint":  # an integer key: the column stays as it is
                by_table.setdefault(model._meta.db_table, []).append(
                    (field.column, "bigint" if to_bigint else key_type)
                )
        for table, columns in by_table.items():
            changes = pg.SQL(", ").join(
                pg.SQL("ALTER COLUMN {column} TYPE {type} USING CAST(CAST({column} AS text) AS {type})").format(
                    column=pg.Identifier(column), type=pg.SQL(sql_type)
                )
                for column, sql_type in columns
            )
            statement = pg.SQL("ALTER TABLE {table} {changes}").format(table=pg.Identifier(table), changes=changes)
            with connection.cursor() as cursor:
                schema_editor.execute(statement.as_string(cursor.connection))

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        self._alter(app_label, schema_editor, to_state, to_bigint=False)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        self._alter(app_label, schema_editor, from_state, to_bigint=True)
