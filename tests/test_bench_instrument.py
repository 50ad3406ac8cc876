"""The benchmark's instrumentation (bench/instrument.py): every instrumented name
resolves against the code as it is, an unresolved one fails naming it, and the bench
modules do not import each other in a cycle.

When a pipeline function the benchmark wraps is renamed, the first test here fails:
rename it in ``bench/instrument.py`` in the same commit (a silently skipped wrapper
would move its statements into another class in the figures)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import instrument
from bench.instrument import SECTIONS, TIMED, InstrumentationError, StatementCounter, Timer, patch_everywhere, timing

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_every_instrumented_name_resolves() -> None:
    for module, attribute, _cls in SECTIONS:
        instrument.resolve(module, attribute)
    for module, attribute in TIMED:
        instrument.resolve(module, attribute)


@pytest.mark.parametrize(
    ("module", "attribute", "named"),
    [
        ("cleanup_ops.execution.batches", "no_such_function", "cleanup_ops.execution.batches.no_such_function"),
        ("cleanup_ops.no_such_module", "run", "cleanup_ops.no_such_module.run"),
        ("cleanup_ops.models", "NoSuchQuerySet.method", "cleanup_ops.models.NoSuchQuerySet.method"),
    ],
)
def test_an_unresolved_name_raises_naming_it(module: str, attribute: str, named: str) -> None:
    with pytest.raises(InstrumentationError, match=named.replace(".", r"\.")):
        patch_everywhere(module, attribute, lambda fn: fn)


def test_sections_install_all_or_nothing() -> None:
    counter = StatementCounter()
    good = ("cleanup_ops.dispatch", "dispatch_due_jobs", "dispatcher")
    bad = ("cleanup_ops.dispatch", "renamed_away", "dispatcher")
    from cleanup_ops import dispatch

    original = dispatch.dispatch_due_jobs
    with pytest.raises(InstrumentationError, match=r"cleanup_ops\.dispatch\.renamed_away"):
        counter.install_sections((good, bad))
    assert dispatch.dispatch_due_jobs is original  # nothing half-installed
    assert counter.installed == []


def test_patch_everywhere_rebinds_importers_and_undoes() -> None:
    from cleanup_ops import dispatch
    from cleanup_ops.execution import runner

    original = dispatch.dispatch_due_jobs
    timer = Timer()
    undo = patch_everywhere("cleanup_ops.dispatch", "dispatch_due_jobs", timer.wrap)
    try:
        assert dispatch.dispatch_due_jobs is not original
        if hasattr(runner, "dispatch_due_jobs"):
            assert runner.dispatch_due_jobs is dispatch.dispatch_due_jobs
    finally:
        undo()
    assert dispatch.dispatch_due_jobs is original


def test_timing_counts_calls_and_raises_on_a_missing_name() -> None:
    module = SimpleNamespace(__name__="fake", work=lambda x: x * 2)
    timer = Timer()
    with timing(module, "work", timer):
        assert module.work(3) == 6
    assert timer.calls == 1
    with pytest.raises(InstrumentationError, match=r"fake\.gone"), timing(module, "gone", timer):
        pass


def _bench_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bench"):
            if node.module == "bench":  # from bench import report, runs
                names.update(f"bench.{a.name}" for a in node.names)
            else:
                names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("bench"))
    return names


def test_no_import_cycle_among_bench_modules() -> None:
    """Imports anywhere in the file (function-level ones too): the cycle the old
    runs.py / statements.py pair had was a function-level import."""
    graph = {f"bench.{p.stem}": _bench_imports(p) for p in BENCH.glob("*.py")}

    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = list(graph.get(start, ()))
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(graph.get(name, ()))
        return seen

    cycles = [name for name in graph if name in reach(name)]
    assert cycles == []


@pytest.mark.django_db
def test_a_composed_statement_is_counted_by_the_text_it_runs_as() -> None:
    """The product's statements reach the execute wrapper composed (a
    ``psycopg.sql.Composed``, neither text nor hashable): rendered with the
    connection they run on, they are classified and keyed as before."""
    from django.db import connection

    from cleanup_ops.execution import statements

    counter = StatementCounter()
    ran: list[object] = []
    statement = statements.ledger_insert_and_jobs_advance()
    with connection.cursor():
        context = {"connection": connection}
        counter.execute_wrapper(lambda *args: ran.append(args[0]), statement, {}, False, context)
    assert ran == [statement]  # executed as it came, composed
    assert dict(counter.counts.calls) == {"ledger insert + job update": 1}
    ((cls, text),) = counter.counts.texts
    assert cls == "ledger insert + job update" and "INSERT INTO" in text
