"""The purge's references written before issue 37 named a storage's key as the
record spelled it (``contracts:contracts//a.pdf``); from 0020 on they name
the storage's canonical name (``contracts:contracts/a.pdf``). This rewrites
the rows already there, so a purge decided after the upgrade sees every
deleted record that named the object, under one decision row:

- ``DeletedAttachment.document_id`` and each ``PurgeRequest``'s
  ``document_ids`` / ``held_document_ids`` (in place: a purge job's cursor
  counts positions in ``document_ids``, so a list keeps its length; a
  document named twice is decided once and counted already done the second
  time);
- ``DocumentDisposition``: the rows of one object merged into one, keeping
  the most careful state (set aside, else pending, else purged) — a set-aside
  file the store no longer has is recorded absent, never "set aside", by the
  next decision, which asks the store first.

A reference of an alias ``STORAGES`` no longer has, or whose key the storage
now refuses, is left as it is. HTTP document ids (no ``:``) are their own
name. Run with the workers stopped (as every migration): a decision running
meanwhile would hold a row this rewrites. Reversing keeps the canonical
references (they are what the purge reads from 0020 on).
"""

from typing import Any

from django.db import migrations

DISPOSITION_CARE = {"set_aside": 0, "pending": 1, "purged": 2}


def _canonicaliser() -> Any:
    """ref -> canonical ref, per the storages configured now (cached per alias)."""
    from cleanup_ops.downstream.stores import storage_store

    stores: dict[str, Any] = {}

    def canonical(ref: str) -> str:
        alias, sep, key = ref.partition(":")
        if not sep:
            return ref  # an HTTP document id
        if alias not in stores:
            try:
                stores[alias] = storage_store(alias)
            except Exception:  # an alias STORAGES no longer has, or a storage that cannot be built
                stores[alias] = None
        store = stores[alias]
        if store is None or store.key_problem(key) is not None:
            return ref
        return f"{alias}:{store.canonical(key)}"

    return canonical


def canonicalise(apps: Any, schema_editor: Any) -> None:
    canonical = _canonicaliser()
    DeletedAttachment = apps.get_model("cleanup_ops", "DeletedAttachment")
    DocumentDisposition = apps.get_model("cleanup_ops", "DocumentDisposition")
    PurgeRequest = apps.get_model("cleanup_ops", "PurgeRequest")

    changed = []
    for row in DeletedAttachment.objects.filter(document_id__contains=":").only("id", "document_id").iterator():
        name = canonical(row.document_id)
        if name != row.document_id:
            row.document_id = name
            changed.append(row)
    DeletedAttachment.objects.bulk_update(changed, ["document_id"], batch_size=1000)

    requests = []
    for request in PurgeRequest.objects.exclude(store="").only("id", "document_ids", "held_document_ids").iterator():
        documents = [canonical(str(d)) for d in request.document_ids or []]
        held = list(dict.fromkeys(canonical(str(d)) for d in request.held_document_ids or []))
        if documents != request.document_ids or held != request.held_document_ids:
            request.document_ids, request.held_document_ids = documents, held
            requests.append(request)
    PurgeRequest.objects.bulk_update(requests, ["document_ids", "held_document_ids"], batch_size=500)

    groups: dict[str, list[Any]] = {}
    for row in DocumentDisposition.objects.filter(document_id__contains=":").iterator():
        groups.setdefault(canonical(row.document_id), []).append(row)
    for name, rows in groups.items():
        if len(rows) == 1 and rows[0].document_id == name:
            continue
        kept = min(rows, key=lambda r: (DISPOSITION_CARE.get(r.state, 0), r.document_id != name, r.id))
        # The group holds every row of the object (the canonical name is its
        # own canonical name), so once the others are gone the name is free.
        DocumentDisposition.objects.filter(pk__in=[r.pk for r in rows if r.pk != kept.pk]).delete()
        DocumentDisposition.objects.filter(pk=kept.pk).update(document_id=name)


class Migration(migrations.Migration):
    dependencies = [
        ("cleanup_ops", "0020_document_spellings"),
    ]

    operations = [
        migrations.RunPython(canonicalise, migrations.RunPython.noop),
    ]
