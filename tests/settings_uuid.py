"""The suite's settings on the third test schema (``tests/schema_uuid``): a host keyed by UUIDs.

``config.settings`` with the demo's user, customers, sites and record kinds
replaced by the UUID schema's: ``AUTH_USER_MODEL``, ``RETENTION_PORTFOLIO_MODEL``,
``RETENTION_PROPERTY_MODEL`` and ``RETENTION_RECORD_KINDS`` name its models, and
the apps whose models point at the models they replace (the demo's
``properties``, the ``demo`` app that seeds it, the second schema
``tests.schema_b``) are not installed. Selected with pytest-django's ``--ds``
(``make test-uuid``; ``tests/test_uuid_schema.py`` runs it from the normal
suite): a pytest process has one set of models, so this is a process of its own.
"""

from __future__ import annotations

from config.settings import *  # noqa: F403 - these settings are config.settings' with the schema swapped
from config.settings import INSTALLED_APPS

# The apps whose models name the demo's customers and sites (the models swapped out here).
DEMO_SCHEMA_APPS = frozenset({"properties", "demo", "tests.schema_b"})

INSTALLED_APPS = [app for app in INSTALLED_APPS if app not in DEMO_SCHEMA_APPS] + ["tests.schema_uuid"]

AUTH_USER_MODEL = "schema_uuid.User"
RETENTION_PORTFOLIO_MODEL = "schema_uuid.Customer"
RETENTION_PROPERTY_MODEL = "schema_uuid.Site"
RETENTION_RECORD_KINDS = {
    "lease": {
        "model": "schema_uuid.Lease",
        "label": "Lease",
        "timestamp": "ended_at",
        "portfolio": "portfolio",
        "property": "property",
        "attachment": {"field": "document_id"},
    },
    "maintenance_record": {
        "model": "schema_uuid.MaintenanceRecord",
        "label": "Maintenance record",
        "timestamp": "closed_at",
        "portfolio": "portfolio",
        "property": "property",
        "attachment": {"field": "document_id"},
    },
}
