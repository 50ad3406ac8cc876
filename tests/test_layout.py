"""The code's layout rules, checked over every Python module the repository tracks.

- A module stays under ``MAX_LINES`` lines (migrations excepted: Django writes them,
  and a squashed history is long by nature). Past that a reader can no longer hold a
  module's protocol in view; split it by what its parts do.
- No module imports another module's underscore name: a leading underscore says
  "this module's own", so a second user means the name wants to be public (or the
  code wants to move). Importing an underscore name from inside one's own package
  ``__init__`` is the same rule: it is another module.

The rules read the source with ``ast``; nothing is imported. ``lint-imports``
(``.importlinter``) keeps the layers and the absence of cycles; this keeps the rest.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 600
# Our top-level packages: a third party's underscore names (typing aliases of django-stubs,
# say) are that party's business.
OUR_PACKAGES = {
    "bench",
    "chaos",
    "cleanup_ops",
    "config",
    "demo",
    "docstore",
    "harness",
    "properties",
    "retention",
    "scripts",
    "tests",
}


def tracked_modules() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "*.py"],  # noqa: S607
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted(ROOT / name for name in listed.split("\0") if name and "/migrations/" not in f"/{name}")


def long_modules(paths: list[Path], *, limit: int = MAX_LINES) -> dict[str, int]:
    lengths = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in paths if p.exists()}
    return {name: n for name, n in lengths.items() if n > limit}


def underscore_imports(path: Path) -> list[str]:
    """``from x import _y`` (``_y`` not a dunder) in ``path``, as "line: module._y"."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        ours = node.level > 0 or (node.module or "").split(".")[0] in OUR_PACKAGES
        for alias in node.names:
            name = alias.name
            if ours and name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                source = "." * node.level + (node.module or "")
                found.append(f"{node.lineno}: {source}{'.' if node.module else ''}{name}")
    return found


def test_every_module_is_under_six_hundred_lines():
    assert long_modules(tracked_modules()) == {}


def test_no_module_imports_another_modules_underscore_name():
    offenders = {}
    for path in tracked_modules():
        if path.exists() and (found := underscore_imports(path)):
            offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from retention.b import _private\n", ["1: retention.b._private"]),
        ("from django.contrib.admin.options import _FieldGroups\n", []),
        ("from . import _sibling, public\n", ["1: ._sibling"]),
        ("def f():\n    from bench.x import _late\n", ["2: bench.x._late"]),
        ("from tests import __version__, public\nimport _thread\n", []),
    ],
)
def test_the_underscore_rule_sees_each_way_a_private_name_is_imported(tmp_path, source, expected):
    module = tmp_path / "m.py"
    module.write_text(source)
    assert underscore_imports(module) == expected


def test_the_length_rule_counts_lines_and_names_the_module(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    short, long = tmp_path / "short.py", tmp_path / "long.py"
    short.write_text("x = 1\n" * 3)
    long.write_text("x = 1\n" * 4)
    assert long_modules([short, long], limit=3) == {"long.py": 4}


def modules_branching_on_the_vendor() -> set[str]:
    """Product modules that call ``is_postgres()`` to take another path.

    ``sql.py`` defines it and ``execution/statements.py`` builds statement texts with
    it (a difference in a statement's text, which sql.py's docstring puts apart).
    """
    found = set()
    for path in tracked_modules():
        name = str(path.relative_to(ROOT))
        if name.startswith("cleanup_ops/") and "is_postgres()" in path.read_text():
            found.add(name.removeprefix("cleanup_ops/"))
    return found - {"sql.py", "execution/statements.py"}


def modules_sql_py_names_as_branching() -> set[str]:
    doc = (ROOT / "cleanup_ops" / "sql.py").read_text()
    sentence = doc.split("branches on ``is_postgres()`` itself:", 1)[1].split("(``tests/test_layout.py``", 1)[0]
    named = {
        f"{package}{module.strip()}.py"
        for package, modules in re.findall(r"``(\w+/)`` \(([^)]*)\)", sentence)
        for module in modules.split(",")
    }
    named |= set(re.findall(r"``([\w/]+\.py)``", sentence))
    return named


def test_sql_py_names_every_module_that_branches_on_the_vendor():
    assert modules_sql_py_names_as_branching() == modules_branching_on_the_vendor()
