"""The third test schema: a host keyed by UUIDs throughout (issue 41).

Its user (``User``, ``AUTH_USER_MODEL``), its customers (``Customer``,
``RETENTION_PORTFOLIO_MODEL``) and its sites (``Site``,
``RETENTION_PROPERTY_MODEL``) are keyed by ``UUIDField(primary_key=True)``;
its record kinds (``lease``, ``maintenance_record``) mirror the demo's
(``properties``) field for field, so that the tests written on the demo's
schema run on it unchanged. Installed only by ``tests.settings_uuid``
(``make test-uuid``, and ``tests/test_uuid_schema.py`` in the normal suite),
never beside the demo's ``properties``: these models take the swappable
settings' place, and the demo's records point at the models they replace.
"""
