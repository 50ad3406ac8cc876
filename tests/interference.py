"""Other actors interfering with a test, for the guarantees' races: a
transaction held open on another connection until the test lets it go
(``Held``), a call made on a connection of its own while the test watches
it wait (``in_thread``; ``conftest.wait_until_blocked`` reads the wait from
``pg_stat_activity``), and a batch hook that raises (``raising``). Also the
guarantees' modules' one clock: the sweep's slot and the instant after it
(``clock``, a fixture a module takes as ``clock = interference.clock``).
"""

from __future__ import annotations

import threading

import pytest
from django.db import connections, transaction

from .conftest import backend_pid, utc

SLOT = utc("2026-08-21T02:00:00Z")
NOW = utc("2026-08-21T02:05:00Z")
NEXT_SLOT = utc("2026-08-22T02:00:00Z")
OLD = utc("2020-01-01T00:00:00Z")
REASON = "operator decision for the test"


@pytest.fixture
def clock(time_machine):  # type: ignore[no-untyped-def]
    time_machine.move_to(NOW, tick=False)
    return time_machine


class Held:
    """Run ``fn`` in a transaction on another connection and keep it open until ``release()``."""

    def __init__(self, fn) -> None:  # type: ignore[no-untyped-def]
        self.fn = fn
        self.ready = threading.Event()
        self.go = threading.Event()
        self.pid = 0
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        assert self.ready.wait(30), "the other connection never got ready"
        if self.errors:
            raise self.errors[0]

    def _run(self) -> None:
        try:
            with transaction.atomic():
                self.pid = backend_pid()
                self.result = self.fn()
                self.ready.set()
                assert self.go.wait(30)
        except BaseException as exc:  # pragma: no cover - re-raised in the test
            self.errors.append(exc)
            self.ready.set()
        finally:
            connections.close_all()

    def release(self) -> None:
        self.go.set()
        self.thread.join(30)
        if self.errors:
            raise self.errors[0]


def in_thread(fn):  # type: ignore[no-untyped-def]
    """Start ``fn`` on a connection of its own; returns (thread, outcome dict)."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["pid"] = backend_pid()
            outcome["result"] = fn()
        except BaseException as exc:  # pragma: no cover - asserted by the caller
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def raising(exc: Exception):  # type: ignore[no-untyped-def]
    def hook(job_id: int) -> None:
        raise exc

    return hook
