"""The code's layout rules, checked over every Python module the repository tracks.

- No module imports another module's underscore name: a leading underscore says
  "this module's own", so a second user means the name wants to be public (or the
  code wants to move). Importing an underscore name from inside one's own package
  ``__init__`` is the same rule: it is another module.

There is no line-count rule: a module is one concept, however long, and is cut
where concepts part (``docs/developing.md``).

The rules read the source with ``ast``; nothing is imported. ``lint-imports``
(``.importlinter``) keeps the layers and the absence of cycles; this keeps the rest.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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
