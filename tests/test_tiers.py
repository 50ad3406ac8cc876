"""Every test has exactly one tier (tests/conftest.py, ``tier_of``): the four
marker expressions partition the suite, so ``make test-fast`` (unit and
database) and the other tiers together are ``make test``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIERS = ("unit", "database", "concurrency", "system")

pytestmark = pytest.mark.system


def collected(expression: str | None) -> int:
    args = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly"]
    if expression is not None:
        args += ["-m", expression]
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)  # noqa: S603 - pytest itself
    if re.search(r"\bno tests collected", result.stdout):
        return 0
    match = re.search(r"(\d+)(?:/\d+)? tests? collected", result.stdout)
    assert match, result.stdout[-2000:] + result.stderr[-2000:]
    return int(match.group(1))


def test_the_four_tiers_partition_the_suite_and_no_test_is_without_one():
    total = collected(None)
    per_tier = {tier: collected(tier) for tier in TIERS}
    assert sum(per_tier.values()) == total, per_tier
    assert all(per_tier.values()), per_tier  # each tier has tests
    assert collected(" and ".join(f"not {tier}" for tier in TIERS)) == 0
