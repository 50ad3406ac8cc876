"""Every test has exactly one tier (tests/conftest.py, ``tier_of``): the four
marker expressions partition the suite, so ``make test-fast`` (unit and
database) and the other tiers together are ``make test``.

One collection lists every test's tier markers (``tests/tier_listing.py``), as
``-m`` reads them: after every ``pytest_collection_modifyitems``, conftest's
included. A second collection with ``make test-fast``'s own ``-m "unit or
database"`` must select exactly the tests listed in those two tiers, which
proves ``-m`` sees the markers conftest gives (a marker added after ``-m``'s
selection would select fewer). Two collections of the whole suite instead of
one per tier: each costs about eight seconds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from .conftest import TIERS

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.system


def collect(*options: str, listing: Path | None = None) -> int:
    """How many tests ``pytest --collect-only`` with ``options`` selects."""
    args = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", *options]
    env = {**os.environ, "TIER_LISTING": str(listing)} if listing is not None else None
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)  # noqa: S603 - pytest itself
    if re.search(r"\bno tests collected", result.stdout):
        return 0
    match = re.search(r"(\d+)(?:/\d+)? tests? collected", result.stdout)
    assert match, result.stdout[-2000:] + result.stderr[-2000:]
    return int(match.group(1))


def test_the_four_tiers_partition_the_suite_and_no_test_is_without_one(tmp_path: Path) -> None:
    listing = tmp_path / "tiers.tsv"
    total = collect("-p", "tests.tier_listing", listing=listing)
    tiers = {
        nodeid: [mark for mark in marks.split(",") if mark in TIERS]
        for nodeid, marks in (line.split("\t") for line in listing.read_text(encoding="utf-8").splitlines())
    }
    assert len(tiers) == total
    assert {nodeid: marks for nodeid, marks in tiers.items() if len(marks) != 1} == {}  # none, or two
    per_tier = Counter(marks[0] for marks in tiers.values())
    assert all(per_tier[tier] for tier in TIERS), per_tier  # each tier has tests
    fast = per_tier["unit"] + per_tier["database"]
    assert collect("-m", "unit or database") == fast, per_tier
