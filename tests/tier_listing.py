"""A plugin for ``tests/test_tiers.py`` (``-p tests.tier_listing``): at the end of
collection, after ``tests/conftest.py`` has given every test its tier, writes each
collected test's tier markers to the file named by ``TIER_LISTING`` — one line a
test, ``<node id>\\t<tier>,<tier>...`` — so one collection tells every test's tiers."""

from __future__ import annotations

import os

import pytest

TIERS = ("unit", "database", "concurrency", "system")


def pytest_collection_finish(session: pytest.Session) -> None:
    path = os.environ.get("TIER_LISTING")
    if not path:
        return
    with open(path, "w", encoding="utf-8") as listing:
        for item in session.items:
            marks = {mark.name for mark in item.iter_markers()}
            listing.write(f"{item.nodeid}\t{','.join(tier for tier in TIERS if tier in marks)}\n")
