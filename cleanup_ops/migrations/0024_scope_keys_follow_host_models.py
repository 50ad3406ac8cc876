"""The columns naming a customer or a site take the host models' key types
(``cleanup_ops.models.scope_keys``): each ``portfolio_id`` / ``property_id``
becomes a ``ScopeKey`` — a foreign key to ``RETENTION_PORTFOLIO_MODEL`` /
``RETENTION_PROPERTY_MODEL`` with no constraint, no index and no reverse
relation — under the same column name.

In the state (a ``SeparateDatabaseAndState`` with no database operation), a
``RemoveField`` of the ``BigIntegerField`` and an ``AddField`` of the
``ScopeKey`` (the field's name loses its ``_id``; its column keeps it). In
the database, after it, ``FollowScopeKeyTypes``: nothing at all
for integer keys (the columns stay ``bigint``; an existing integer-keyed
installation upgrades without a statement, ``sqlmigrate`` shows none), an
``ALTER COLUMN … TYPE`` to the key's type otherwise (a fresh installation:
the tables are empty).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations

from cleanup_ops.models.scope_keys import FollowScopeKeyTypes, ScopeKey

PORTFOLIO_AND_PROPERTY = ["cleanupjob", "deadletter", "deletedattachment", "ledgerentry", "purgerequest"]

STATE = []
for _model in PORTFOLIO_AND_PROPERTY:
    STATE += [
        migrations.RemoveField(model_name=_model, name="portfolio_id"),
        migrations.RemoveField(model_name=_model, name="property_id"),
        migrations.AddField(
            model_name=_model,
            name="portfolio",
            field=ScopeKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to=settings.RETENTION_PORTFOLIO_MODEL,
            ),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name=_model,
            name="property",
            field=ScopeKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to=settings.RETENTION_PROPERTY_MODEL,
            ),
        ),
    ]
STATE += [
    migrations.RemoveField(model_name="pipelinepause", name="portfolio_id"),
    migrations.AddField(
        model_name="pipelinepause",
        name="portfolio",
        field=ScopeKey(
            blank=True,
            db_constraint=False,
            db_index=False,
            null=True,
            on_delete=django.db.models.deletion.DO_NOTHING,
            related_name="+",
            to=settings.RETENTION_PORTFOLIO_MODEL,
        ),
    ),
]


class Migration(migrations.Migration):
    dependencies = [
        ("cleanup_ops", "0023_api_tokens_to_knox"),
        migrations.swappable_dependency(settings.RETENTION_PORTFOLIO_MODEL),
        migrations.swappable_dependency(settings.RETENTION_PROPERTY_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=STATE),
        FollowScopeKeyTypes(
            fields=[
                *((model, name) for model in PORTFOLIO_AND_PROPERTY for name in ("portfolio", "property")),
                ("pipelinepause", "portfolio"),
            ]
        ),
    ]
