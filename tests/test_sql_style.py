"""SQL reads as SQL: the product writes every statement as a ``psycopg.sql.SQL``
template (identifiers as ``sql.Identifier``, values as parameters or
``sql.Literal``) kept ``Composable`` until it executes. This test reads the
product's source (no database) and refuses, in every module, the ways text
SQL crept in before:

* an f-string whose text carries SQL (``f"SELECT … {table}"``);
* ``str.format`` or ``%`` on a string literal that carries SQL;
* ``.as_string(None)`` (a composed statement turned back into text, to be
  edited or spliced by hand);
* ``.replace(…)`` / ``.split(…)`` with a SQL fragment as its argument (editing
  a statement's text).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("retention", "cleanup_ops")

pytestmark = pytest.mark.unit

# Upper-case keywords as they start or join a clause; prose in messages is lower case.
SQL_WORDS = re.compile(
    r"\b(SELECT|INSERT INTO|UPDATE|DELETE FROM|DELETE|WHERE|FROM|JOIN|VALUES|RETURNING|GROUP BY|ORDER BY"
    r"|FOR UPDATE|FOR SHARE|CAST|WITH|UNION|LIMIT|EXISTS|ON CONFLICT|SET|AND|OR|IN|ANY|AS|NULL)\b"
)


def _sql_like(text: str) -> bool:
    """Text that is SQL: two keywords (a lone "AND" or "SET" can be prose)."""
    return len(SQL_WORDS.findall(text)) >= 2


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}"


def _literal_text(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return None


def findings_in(source: str, path: str) -> list[Finding]:
    found: list[Finding] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            text = _literal_text(node) or ""
            if _sql_like(text):
                found.append(Finding(path, node.lineno, "f-string SQL"))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            text = _literal_text(node.left)
            if text is not None and _sql_like(text):
                found.append(Finding(path, node.lineno, "%-formatted SQL text"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method, receiver = node.func.attr, node.func.value
            if method == "format":
                text = _literal_text(receiver)
                if text is not None and _sql_like(text):
                    found.append(Finding(path, node.lineno, "str.format on SQL text (use sql.SQL(...).format)"))
            elif method == "as_string" and (
                not node.args or (isinstance(node.args[0], ast.Constant) and node.args[0].value is None)
            ):
                found.append(Finding(path, node.lineno, ".as_string(None): a composed statement turned into text"))
            elif method in {"replace", "split"} and node.args:
                text = _literal_text(node.args[0])
                if text is not None and (SQL_WORDS.search(text) or text == "%s"):
                    found.append(Finding(path, node.lineno, f".{method}() editing a statement's text"))
    return found


def product_findings() -> list[Finding]:
    found: list[Finding] = []
    for package in PRODUCT:
        for file in sorted((ROOT / package).rglob("*.py")):
            relative = str(file.relative_to(ROOT))
            found.extend(findings_in(file.read_text(), relative))
    return found


def assert_no_text_sql(found: list[Finding]) -> None:
    assert not found, "SQL written as text:\n" + "\n".join(map(str, found))


def test_no_product_module_writes_sql_as_text() -> None:
    """Every statement of the product is composed (``cleanup_ops.sql.composed``):
    no finding in any module of ``PRODUCT``, and no allowance per module. A
    new finding fails here with its place and rule."""
    assert_no_text_sql(product_findings())


def test_a_module_with_an_f_string_statement_fails_naming_its_line() -> None:
    module = 'from django.db import connection\n\ndef rows(table):\n    return f"SELECT id FROM {table} WHERE x = 1"\n'
    with pytest.raises(AssertionError, match=r"cleanup_ops/x\.py:4: f-string SQL"):
        assert_no_text_sql(findings_in(module, "cleanup_ops/x.py"))


@pytest.mark.parametrize(
    ("source", "rule"),
    [
        ('q = f"SELECT id FROM {table} WHERE x = 1"', "f-string SQL"),
        ('q = "DELETE FROM %s WHERE id = ANY(%%s)" % table', "%-formatted SQL text"),
        ('q = "SELECT * FROM {} WHERE a IN (1)".format(t)', "str.format on SQL text (use sql.SQL(...).format)"),
        ("text = statement.as_string(None)", ".as_string(None): a composed statement turned into text"),
        ('text = text.replace("WITH ", "WITH RECURSIVE ")', ".replace() editing a statement's text"),
        ('parts = text.split("%s")', ".split() editing a statement's text"),
    ],
    ids=["f-string", "percent", "str-format", "as-string-none", "replace", "split"],
)
def test_each_way_of_writing_sql_as_text_is_found(source: str, rule: str) -> None:
    assert [f.rule for f in findings_in(source, "x.py")] == [rule]


@pytest.mark.parametrize(
    "source",
    [
        'q = sql.SQL("SELECT id FROM {table} WHERE x = %s").format(table=sql.Identifier(t))',
        'raise ValueError(f"{name}: expected a number, got {raw!r}")',
        'msg = f"select the {kind} and delete it from the list"',
        "text = statement.as_string(connection)",
    ],
    ids=["composed", "message", "prose", "as-string-with-a-connection"],
)
def test_composed_sql_and_prose_are_not_findings(source: str) -> None:
    assert findings_in(source, "x.py") == []
