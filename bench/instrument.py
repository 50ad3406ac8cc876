"""The benchmark's in-process instrumentation, in one module: wrappers put around the
pipeline's functions while a run is measured.

* ``patch_everywhere``: replace a function by a wrapper in its module and in every
  loaded ``cleanup_ops`` module that imported it by name;
* ``timing`` / ``Timer``: time the calls of one module attribute while inside a block;
* ``StatementCounter``: a Django execute wrapper that counts every statement and its
  client-side time by class (the innermost ``SECTIONS`` function running when it was
  sent, else its text, ``statements.classify_text``), and the commits and rollbacks;
* ``TIMED``: the functions the counted drain times per call.

Every name listed here must resolve. A function renamed or moved by a later commit
raises ``InstrumentationError`` naming it instead of being skipped: a skipped wrapper
silently moves its statements into another class (or its time out of a timer), and
the figures would then describe a pipeline that no longer exists. When a function is
renamed, rename it here in the same commit.

This module depends on ``bench.statements`` (the text classes) and nothing else of
the benchmark's, so ``bench.runs`` and ``bench.statements`` no longer import each
other.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from bench.statements import DATA_CLASSES, classify_text, short, statement_text

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]

# (module, attribute, class): the innermost of these running when a statement is sent
# names its class. Every one must resolve (see the module docstring).
SECTIONS: tuple[tuple[str, str, str], ...] = (
    ("cleanup_ops.schedule", "sweep_trigger", "admission"),
    ("cleanup_ops.admission", "sweep_admit", "admission"),
    ("cleanup_ops.execution.leases", "jobs_lease_group", "lease/pick"),
    ("cleanup_ops.execution.leases", "job_lease", "lease/pick"),
    ("cleanup_ops.execution.batches", "jobs_load", "job load"),
    ("cleanup_ops.execution.batches", "job_load", "job load"),
    ("cleanup_ops.execution.batches", "_fence_scopes_and_policies", "fence + scope lock + policy"),
    ("cleanup_ops.execution.leases", "lock_job", "fence"),
    ("cleanup_ops.execution.batches", "_policies_and_replayed", "policy + ledger lookup"),
    ("cleanup_ops.execution.batches", "_replayed_operations", "ledger lookup"),
    ("cleanup_ops.execution.candidates", "_count_candidates", "candidates"),
    ("cleanup_ops.execution.candidates", "_delete", "DELETE"),
    ("cleanup_ops.execution.candidates", "_count_and_delete_alone", "candidates + DELETE"),
    ("cleanup_ops.execution.leases", "jobs_release", "job release"),
    ("cleanup_ops.execution.leases", "job_release", "job release"),
    ("cleanup_ops.execution.leases", "group_tokens", "rate tokens"),
    ("cleanup_ops.sweeps", "sweep_mark_drained_if_finished", "sweep status"),
    ("cleanup_ops.dispatch", "fair_due_job_ids", "dispatcher"),
    ("cleanup_ops.dispatch", "dispatch_due_jobs", "dispatcher"),
    ("cleanup_ops.recovery.failures", "job_fail", "failure/redrive"),
)

# Functions timed per call in the counted run (wall time, inclusive), to tell SQL time
# from Python and COMMIT time. Every one must resolve.
TIMED: tuple[tuple[str, str], ...] = (
    ("cleanup_ops.schedule", "sweep_trigger"),
    ("cleanup_ops.execution.runner", "group_run_slice"),
    ("cleanup_ops.execution.runner", "job_run_slice"),
    ("cleanup_ops.execution.batches", "run_group_batch"),
    ("cleanup_ops.execution.leases", "jobs_lease_group"),
    ("cleanup_ops.execution.batches", "jobs_load"),
    ("cleanup_ops.execution.leases", "jobs_release"),
    ("cleanup_ops.sweeps", "sweep_mark_drained_if_finished"),
    ("cleanup_ops.dispatch", "fair_due_job_ids"),
)


class InstrumentationError(RuntimeError):
    """A name the benchmark instruments does not exist (renamed or moved by a later commit)."""


def resolve(module: str, attribute: str) -> tuple[Any, str, Callable[..., Any]]:
    """(owner, name, the callable) for ``module.attribute`` (``attribute`` may be dotted,
    ``Class.method``), or ``InstrumentationError`` naming what is missing."""
    qualified = f"{module}.{attribute}"
    try:
        owner: Any = importlib.import_module(module)
    except ImportError as exc:
        raise InstrumentationError(f"cannot instrument {qualified}: module {module} does not import ({exc})") from exc
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            raise InstrumentationError(f"cannot instrument {qualified}: {module} has no {part}")
    original = getattr(owner, name, None)
    if not callable(original):
        raise InstrumentationError(
            f"cannot instrument {qualified}: no such function (renamed? update bench/instrument.py)"
        )
    return owner, name, original


def patch_everywhere(module: str, attribute: str, wrap: Wrap) -> Callable[[], None]:
    """Replace ``module.attribute`` by ``wrap(it)`` in its module and in every loaded
    cleanup_ops module that imported it by name (``from … import run_batch``), so that
    calls from any module go through the wrapper. Returns the function that puts the
    originals back; raises ``InstrumentationError`` if the name does not resolve."""
    owner, name, original = resolve(module, attribute)
    wrapped = wrap(original)
    setattr(owner, name, wrapped)
    rebound: list[Any] = []
    if "." not in attribute:
        for loaded_name, loaded in list(sys.modules.items()):
            if loaded_name.startswith("cleanup_ops") and getattr(loaded, name, None) is original:
                setattr(loaded, name, wrapped)
                rebound.append(loaded)

    def undo() -> None:
        setattr(owner, name, original)
        for loaded in rebound:
            setattr(loaded, name, original)

    return undo


class Timer:
    """Calls and inclusive wall seconds of the functions it wraps."""

    def __init__(self) -> None:
        self.total = 0.0
        self.calls = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - started
                self.calls += 1

        return wrapper


@contextmanager
def timing(module: Any, name: str, timer: Timer) -> Iterator[None]:
    """Time calls to ``module.name`` (looked up by name at call time) while inside.
    ``InstrumentationError`` if the module has no such function."""
    original = getattr(module, name, None)
    if not callable(original):
        raise InstrumentationError(
            f"cannot time {getattr(module, '__name__', module)}.{name}: no such function"
            " (renamed? update the benchmark)"
        )
    setattr(module, name, timer.wrap(original))
    try:
        yield
    finally:
        setattr(module, name, original)


@dataclass
class Counts:
    """Statements and seconds per class (and per statement text, for the listing)."""

    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    params: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    texts: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    commits: int = 0
    rollbacks: int = 0

    def as_json(self) -> dict[str, Any]:
        top = sorted(self.texts.items(), key=lambda kv: -kv[1][1])[:40]
        return {
            "calls": dict(self.calls),
            "seconds": {k: round(v, 5) for k, v in self.seconds.items()},
            "params": dict(self.params),
            "top": [[cls, short(text), int(n), round(s, 5)] for (cls, text), (n, s) in top],
            "commits": self.commits,
            "rollbacks": self.rollbacks,
        }


class StatementCounter:
    """The execute wrapper and the section wrappers of one process (see the module doc)."""

    def __init__(self) -> None:
        self.counts = Counts()
        self.stack: list[str] = []
        self.installed: list[str] = []

    def section(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.stack.append(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.stack.pop()

        return wrapper

    def install_sections(self, sections: tuple[tuple[str, str, str], ...] = SECTIONS) -> None:
        """Every section's wrapper; all of them resolve before any is installed, so a
        failure leaves nothing half-patched."""
        missing = []
        for module, attribute, _name in sections:
            try:
                resolve(module, attribute)
            except InstrumentationError as exc:
                missing.append(str(exc))
        if missing:
            raise InstrumentationError("; ".join(missing))
        for module, attribute, name in sections:
            patch_everywhere(module, attribute, lambda fn, name=name: self.section(name, fn))
            self.installed.append(f"{module}.{attribute}")

    def execute_wrapper(
        self, execute: Callable[..., Any], statement: Any, params: Any, many: bool, context: dict[str, Any]
    ) -> Any:
        started = time.perf_counter()
        try:
            return execute(statement, params, many, context)
        finally:
            elapsed = time.perf_counter() - started
            # A composed statement (the product's) as the text it ran as: a
            # Composed is neither hashable (the per-text key below) nor text.
            statement = statement_text(statement, context["connection"].connection)
            text_class = classify_text(statement)
            if text_class == "transaction control" or not self.stack:
                cls = text_class
            else:
                cls = self.stack[-1]
                # The ledger insert and the job update run in run_group_batch itself.
                if (
                    text_class in ("ledger insert", "job update", "ledger insert + job update")
                    and cls not in DATA_CLASSES
                ):
                    cls = text_class
            c = self.counts
            c.calls[cls] += 1
            c.seconds[cls] += elapsed
            if params and not many:
                c.params[cls] += len(params)
            key = (cls, statement)
            entry = c.texts.get(key)
            if entry is None:
                c.texts[key] = [1, elapsed]
            else:
                entry[0] += 1
                entry[1] += elapsed

    @contextmanager
    def active(self) -> Iterator[None]:
        """Count on the default connection (commits and rollbacks too) while inside."""
        from django.db import connection

        connection.ensure_connection()
        real_commit, real_rollback = connection._commit, connection._rollback

        def commit() -> Any:
            self.counts.commits += 1
            return real_commit()

        def rollback() -> Any:
            self.counts.rollbacks += 1
            return real_rollback()

        connection._commit, connection._rollback = commit, rollback
        try:
            with connection.execute_wrapper(self.execute_wrapper):
                yield
        finally:
            connection._commit, connection._rollback = real_commit, real_rollback
