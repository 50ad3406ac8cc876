"""A one-line terminal progress bar for management commands (stdlib only)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

ProgressFn = Callable[[int, int], None]


def progress_bar(stream: TextIO = sys.stderr) -> ProgressFn | None:
    """A one-line progress bar on a terminal; nothing when output is piped."""
    if not stream.isatty():
        return None

    def show(done: int, total: int) -> None:
        width = 30
        filled = int(width * done / total) if total else width
        stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done >= total:
            stream.write("\n")
        stream.flush()

    return show
