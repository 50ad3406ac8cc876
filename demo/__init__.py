"""The demo: deterministic seed data, demo users, attachments and the demo document store.

The top layer: it may use ``cleanup_ops``, ``retention`` and ``properties``;
nothing imports it. Commands: ``seed_demo``, ``seed_attachments``, ``run_docstore``.
"""
