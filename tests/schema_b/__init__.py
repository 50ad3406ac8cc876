"""A second schema for the suite: record kinds whose names and shapes are not the demo's.

Other field names (``customer``, ``building``, ``closed_on``, ``contract_ref``),
another primary key column (``number``), a ``DateField`` timestamp. The tables
are created by the test database's ``syncdb`` (this app has no migrations);
the kinds are configured per test through ``RETENTION_RECORD_KINDS``
(``tests/test_record_kinds.py``).
"""
