"""Test storages: the file system with its own log of deletions.

The interleaving matrix checks, in commit order, that no file left a store
while a living record or a hold needed it; for that it needs the store's own
record of when each file went (the HTTP document store and moto's S3, behind
``harness.s3.S3Proxy``, keep one). ``LoggedFileSystemStorage`` is Django's
``FileSystemStorage`` with that log: each ``delete`` of a file that existed
appends ``{"name": …, "at": …}`` to the file ``log``, stamped by the real
clock (``harness.s3.wall_clock``), not a test's frozen one.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.files.storage import FileSystemStorage

from harness.s3 import wall_clock


class LoggedFileSystemStorage(FileSystemStorage):
    def __init__(self, *, log: str, **options: Any) -> None:
        super().__init__(**options)
        self.log = log

    def delete(self, name: str) -> None:
        existed = self.exists(name)
        super().delete(name)
        if existed:
            with open(self.log, "a", encoding="utf-8") as out:
                out.write(json.dumps({"name": name, "at": wall_clock()}) + "\n")


def deletions(log: str) -> list[tuple[str, float]]:
    try:
        with open(log, encoding="utf-8") as lines:
            return [(entry["name"], entry["at"]) for entry in map(json.loads, lines)]
    except FileNotFoundError:
        return []
