"""A small HTTP document store for the demo and the tests (stdlib only).

Run it with ``python -m docstore --port 8765 --db var/docstore.sqlite3`` or
``python manage.py run_docstore``. See ``docstore.server`` for the protocol.
"""
