"""The repository as the documentation checks read it: its root, its files
(git's list, or a walk outside git) and directories, our packages and the
product's own among them. Shared by ``tests/test_docs.py`` (citations) and
``tests/test_docs_configuration.py`` (the settings the product reads).
"""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["config", "properties", "retention", "cleanup_ops", "demo", "docstore", "harness", "bench", "chaos"]
# The product's own code: where a setting can be read.
PRODUCT = ["config", "properties", "retention", "cleanup_ops", "demo", "docstore"]


@cache
def tracked_files() -> frozenset[str]:
    """The repository's files: git's list (tracked and not ignored), or a walk outside git."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],  # noqa: S607
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        skipped = {".git", ".venv", "var", "__pycache__", ".pytest_cache", ".ruff_cache"}
        listed = [
            str(path.relative_to(ROOT))
            for path in ROOT.rglob("*")
            if path.is_file() and not skipped & set(path.relative_to(ROOT).parts)
        ]
    return frozenset(path for path in listed if (ROOT / path).exists())


@cache
def tracked_dirs() -> frozenset[str]:
    return frozenset(str(parent) for path in tracked_files() for parent in Path(path).parents if str(parent) != ".")
