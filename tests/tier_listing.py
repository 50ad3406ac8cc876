"""A plugin for ``tests/test_tiers.py`` (``-p tests.tier_listing``): at the end of
collection, after ``tests/conftest.py`` has given every test its tier, writes each
collected test's markers to the file named by ``TIER_LISTING`` — one line a test,
``<node id>\\t<marker>,<marker>...`` — so one collection tells every test's tiers
(which of its markers are tiers is ``tests/conftest.py``'s ``TIERS``)."""

from __future__ import annotations

import os

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    path = os.environ.get("TIER_LISTING")
    if not path:
        return
    with open(path, "w", encoding="utf-8") as listing:
        for item in session.items:
            marks = sorted({mark.name for mark in item.iter_markers()})
            listing.write(f"{item.nodeid}\t{','.join(marks)}\n")
