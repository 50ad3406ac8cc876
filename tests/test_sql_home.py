"""Where a statement lives: in the module that runs it, next to what it is
about — never in ``cleanup_ops/sql.py``, which holds only the helpers every
statement is composed and run with and the names a template may use
(docs/developing.md).

The rule reads ``cleanup_ops/sql.py`` with ``ast`` (nothing is imported): every
top-level function is one of the composition helpers, and no string in it is
SQL text that starts a statement (``SELECT``, ``INSERT``, ``UPDATE``,
``DELETE``, ``WITH``, ``MERGE``), so a statement cannot come back as a
builder or as a module-level constant.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
SQL_MODULE = ROOT / "cleanup_ops" / "sql.py"

# The composition helpers: how a statement is built (``composed``, ``ident``,
# the row lists and their arrays' text, ``any_of``, ``lease_cleared``), cached (``statement``) and run
# (``execute``). A new helper joins this list; a statement goes to its caller.
HELPERS = frozenset(
    {
        "any_of",
        "any_params",
        "array_text",
        "composed",
        "execute",
        "ident",
        "lease_cleared",
        "rows_cte",
        "rows_params",
        "statement",
        "typed",
        "values_list",
    }
)
# The product writes SQL keywords in capitals; prose ("With the rows …") is not SQL.
STATEMENT_TEXT = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH|MERGE)\b")


def statements_in(source: str) -> list[str]:
    """What in ``source`` is a statement rather than a helper, as "line: what"."""
    tree = ast.parse(source)
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name not in HELPERS:
            found.append(f"{node.lineno}: def {node.name} (not a composition helper)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and STATEMENT_TEXT.match(node.value):
            found.append(f"{node.lineno}: SQL text {node.value.split()[0]!r}")
    return sorted(found, key=lambda line: int(line.split(":")[0]))


def test_cleanup_ops_sql_defines_no_statement():
    """Each statement lives in the module that runs it; ``cleanup_ops/sql.py`` composes."""
    assert statements_in(SQL_MODULE.read_text()) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            'def sweep_lock_running():\n    return composed("""\n    SELECT id FROM {sweep} FOR UPDATE\n    """)\n',
            ["1: def sweep_lock_running (not a composition helper)", "2: SQL text 'SELECT'"],
        ),
        ('PURGE_ADVANCE = pg.SQL("UPDATE {job} SET cursor = %s")\n', ["1: SQL text 'UPDATE'"]),
        (
            "def max_locks():\n    return pg.SQL(\"SELECT current_setting('max_locks_per_transaction')\")\n",
            [
                "1: def max_locks (not a composition helper)",
                "2: SQL text 'SELECT'",
            ],
        ),
        ('"""With the rows ``rows_params`` gives; Update nothing."""\n', []),
        ("def composed(template, **parts):\n    return pg.SQL(template).format(**parts)\n", []),
        ('def rows_cte(name):\n    return pg.SQL("{name}({names}) AS (SELECT * FROM unnest({arrays}))")\n', []),
        ('JOB = CleanupJob._meta.db_table\nNAMES = {"job": pg.Identifier(JOB)}\n', []),
    ],
)
def test_the_rule_finds_a_statement_however_it_is_written(source, expected):
    assert statements_in(source) == expected
