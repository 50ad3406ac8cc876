"""The documentation tells the truth about the code it cites.

Two checks, both on the files themselves (no database):

- **Citations.** Every file path, dotted Python name and test name that
  ``README.md`` and ``docs/**/*.md`` cite in backticks exists, and every
  relative Markdown link points at a file (and heading) that exists. The rules:

  - a *path* (``cleanup_ops/sql.py``, ``docs/deploy/``) is relative to the
    repository root; one written inside an app (``execution/batches.py``,
    ``console_selectors/waiting.py``) must name exactly one file of one app.
    ``<app>/<NNNN>`` names a migration (``properties/0003``). Paths under
    ``var/`` are written at run time and absolute paths are the host's, so
    neither is checked. A bare file name (``leases.py``) must exist somewhere.
  - a *dotted name* whose first part is one of our packages
    (``cleanup_ops.downstream.decision.purge_decide``), a module of exactly one of our
    packages (``execution.batches.operation_id``) or one of our models
    (``CleanupJob.objects.due_work``) must import: a module, then attributes
    (a model's fields count). ``app.Model`` is a model label.
  - a *test name* (``test_x``, or ``tests/test_x.py::test_x``) must be a test
    function of the nearest test file cited before it in the same paragraph
    or table row, or of some test file when none is.

- **Sections.** Every section a module (or a file of ``docs/deploy/``) cites
  as ``docs/x.md, "Title"`` exists.

The configuration reference (``docs/configuration.md`` against the settings the
product reads) is checked in ``tests/test_docs_configuration.py``.
"""

from __future__ import annotations

import ast
import importlib
import re
from functools import cache
from pathlib import Path

from .repository import PACKAGES, PRODUCT, ROOT, tracked_dirs, tracked_files

DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FILE_EXTENSIONS = (".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh", ".service", ".timer", ".example", ".html")
# A dotted citation ending so is a file name (``proof.json``), not a Python name.
DATA_EXTENSIONS = (*FILE_EXTENSIONS, ".json", ".csv", ".sqlite3", ".env", ".log", ".cfg", ".ini")
# Dotted names that are not Python's, with what they are.
NOT_PYTHON_NAMES = {"retention.dead": "the RabbitMQ broker's dead-letter queue"}


# --- reading the documents -------------------------------------------------------


def doc_blocks(path: Path) -> list[tuple[int, str]]:
    """(first line number, text) of each paragraph, list item run or table row outside fenced code."""
    blocks: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    fenced = False

    def flush() -> None:
        if current:
            blocks.append((start, " ".join(line.strip() for line in current)))
            current.clear()

    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            flush()
            fenced = not fenced
            continue
        if fenced:
            continue
        if not line.strip() or line.lstrip().startswith("|"):
            flush()
            if line.strip():
                blocks.append((number, line.strip()))
            continue
        if not current:
            start = number
        current.append(line)
    flush()
    return blocks


def citations() -> list[tuple[str, int, str, str | None]]:
    """(document, line, backticked text, the test file cited before it in its block)."""
    found = []
    for path in DOC_FILES:
        name = str(path.relative_to(ROOT))
        for line, text in doc_blocks(path):
            test_file = None
            for match in re.finditer(r"`([^`]+)`", text):
                span = match.group(1).strip()
                found.append((name, line, span, test_file))
                file_match = re.search(r"(?:^|/)(test_\w+\.py)(?:::|$)", span)
                if file_match:
                    test_file = file_match.group(1)
    return found


# --- resolving what a citation names -------------------------------------------------


def migration_exists(app: str, number: str) -> bool:
    return any(path.startswith(f"{app}/migrations/{number}_") for path in tracked_files())


def path_problem(span: str) -> str | None:
    """Why a path-like citation names nothing, or None when it is fine (or not a path)."""
    token = span.rstrip(".,;:")
    if token.startswith(("/", "~", "-", "$", "http")) or "://" in token or any(c in token for c in "<>{}*…$=@"):
        return None
    if token.startswith(("var/", ".venv/")):
        return None
    if not re.fullmatch(r"[\w.\-/]+", token):
        return None
    first = token.split("/", 1)[0]
    top_level = {path.split("/", 1)[0] for path in tracked_files()}
    looks_like_file = token.endswith(FILE_EXTENSIONS)
    if "/" not in token:
        if token.startswith(".") or not looks_like_file or any(Path(path).name == token for path in tracked_files()):
            return None
        return f"no file named {token} in the repository"
    migration = re.fullmatch(r"(\w+)/(\d{4})", token)
    if migration:
        return None if migration_exists(*migration.groups()) else f"no migration {token}"
    app_dirs = {path.split("/", 1)[0] for path in tracked_files()} & set(PACKAGES)
    inside_app = [f"{app}/{token}" for app in app_dirs if exists(f"{app}/{token}")]
    if (
        first not in top_level
        and not looks_like_file
        and not any(d.endswith("/" + first) or d == first for d in tracked_dirs())
    ):
        return None  # a MIME type, a route fragment, a ratio: not a path
    if exists(token):
        return None
    if len(inside_app) == 1:
        return None
    if len(inside_app) > 1:
        return f"{token} names a file in several apps: {inside_app}"
    return f"no such path: {token}"


def exists(path: str) -> bool:
    path = path.rstrip("/")
    return path in tracked_files() or path in tracked_dirs()


@cache
def our_models() -> dict[str, type]:
    from django.apps import apps

    return {model.__name__: model for model in apps.get_models() if model.__module__.split(".")[0] in PACKAGES}


def permission_codenames(app_label: str) -> set[str]:
    """``cleanup_ops.add_sweep``: a permission's label is its app and its codename."""
    from django.apps import apps

    codenames = set()
    for model in apps.get_app_config(app_label).get_models():
        opts = model._meta
        codenames.update(f"{action}_{opts.model_name}" for action in opts.default_permissions)
        codenames.update(codename for codename, _ in opts.permissions)
    return codenames


def module_roots(first: str) -> list[str]:
    """The packages under which ``first`` is a module (``execution`` → cleanup_ops)."""
    roots = []
    for package in PACKAGES:
        if exists(f"{package}/{first}.py") or exists(f"{package}/{first}/__init__.py"):
            roots.append(package)
    return roots


def resolve(parts: list[str]) -> bool:
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            target = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                continue
            raise
        return attributes_resolve(target, parts[cut:])
    return False


def attributes_resolve(target: object, rest: list[str]) -> bool:
    from django.db import models

    for attribute in rest:
        if isinstance(target, type) and issubclass(target, models.Model):
            try:
                target._meta.get_field(attribute)
            except Exception:  # noqa: S110 - not a field: try an attribute
                pass
            else:
                return True
        if not hasattr(target, attribute):
            return False
        target = getattr(target, attribute)
    return True


def dotted_problem(span: str) -> str | None:
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", span) or span.endswith(DATA_EXTENSIONS):
        return None
    if span in NOT_PYTHON_NAMES or any(Path(path).name == span for path in tracked_files()):
        return None  # a queue's name, or a file's (docs/deploy/retention.cron)
    parts = span.split(".")
    first = parts[0]
    if first in PACKAGES or first == "django_q":
        if resolve(parts):
            return None
        if len(parts) >= 2 and first in PACKAGES:
            from django.apps import apps

            try:
                model = apps.get_model(first, parts[1])
            except (LookupError, ValueError):
                pass
            else:
                if attributes_resolve(model, parts[2:]):
                    return None
            if len(parts) == 2 and parts[1] in permission_codenames(first):
                return None
        return f"{span} does not import"
    if first in our_models():
        return None if attributes_resolve(our_models()[first], parts[1:]) else f"{span}: no such attribute"
    roots = module_roots(first)
    if len(roots) == 1:
        return None if resolve([roots[0], *parts]) else f"{span} (in {roots[0]}) does not import"
    return None  # e.g. a system check id (axes.W006) or a name of another library


@cache
def functions_in_test_file(file_name: str) -> frozenset[str]:
    names = set()
    for path in (ROOT / "tests").glob(file_name):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
    return frozenset(names)


def cited_test_problem(span: str, test_file: str | None) -> str | None:
    pair = re.fullmatch(r"(?:tests/)?(test_\w+\.py)::(test_\w+)", span)
    if pair:
        file_name, name = pair.groups()
        if not (ROOT / "tests" / file_name).exists():
            return f"no test file tests/{file_name}"
        return None if name in functions_in_test_file(file_name) else f"{name} is not in tests/{file_name}"
    if not re.fullmatch(r"test_\w+", span):
        return None
    if test_file is not None:
        return None if span in functions_in_test_file(test_file) else f"{span} is not in tests/{test_file}"
    return None if span in functions_in_test_file("test_*.py") else f"{span} is in no test file"


def github_slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    slugs = []
    fenced = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            slugs.append(github_slug(line.lstrip("#")))
    return frozenset(slugs)


def link_problems(path: Path) -> list[str]:
    problems = []
    for line, text in doc_blocks(path):
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                problems.append(f"{path.name}:{line}: link to a missing file {target}")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                problems.append(f"{path.name}:{line}: link to a missing heading {target}")
    return problems


# --- the citation tests -------------------------------------------------------------


def test_every_cited_path_exists():
    problems = []
    for doc, line, span, _ in citations():
        for token in span.split():
            problem = path_problem(token)
            if problem:
                problems.append(f"{doc}:{line}: {problem}")
    assert problems == []


def test_every_cited_dotted_name_imports():
    problems = [
        f"{doc}:{line}: {problem}"
        for doc, line, span, _ in citations()
        for problem in [dotted_problem(span)]
        if problem
    ]
    assert problems == []


def test_every_cited_test_exists():
    problems = [
        f"{doc}:{line}: {problem}"
        for doc, line, span, test_file in citations()
        for problem in [cited_test_problem(span, test_file)]
        if problem
    ]
    assert problems == []


def test_every_relative_link_reaches_a_file_and_heading():
    assert [problem for path in DOC_FILES for problem in link_problems(path)] == []


# Sections the code cites that do not exist yet, each with who fixes it; the
# test fails once one is fixed, so the entry is removed with the fix.
PENDING_SECTIONS: set[tuple[str, str, str]] = set()


def headings(path: Path) -> set[str]:
    return {
        line.lstrip("#").strip().replace("`", "").lower()
        for line in path.read_text().splitlines()
        if line.startswith("#")
    }


def cited_sections() -> list[tuple[str, str, str]]:
    """(source file, document, section title) for each ``docs/x.md, "Title"`` a module, or a
    file of ``docs/deploy/``, cites."""
    pattern = re.compile(r"`*((?:docs/[\w/-]+\.md)|README(?:\.md)?)`*(?:,\s*|\s+\()\"([^\"\n]{1,80})\"")
    found = []
    for path in sorted(tracked_files()):
        code = path.split("/", 1)[0] in [*PACKAGES, "tests"] and path.endswith(".py")
        deployment = path.startswith("docs/deploy/") and not path.endswith(".md")  # units, manifests, rules
        if not (code or deployment) or path.endswith("test_docs.py"):
            continue
        for document, title in pattern.findall((ROOT / path).read_text()):
            found.append((path, "README.md" if document.startswith("README") else document, title))
    return found


def test_every_section_the_code_cites_exists():
    missing = []
    for source, document, title in cited_sections():
        target = ROOT / document
        wanted = title.lower()
        # The title, or its start before a colon or parenthesis ("Fleet modes: warm against …").
        if not target.exists() or not any(
            heading == wanted or heading.startswith((f"{wanted}:", f"{wanted} (")) for heading in headings(target)
        ):
            missing.append((source, document, title))
    assert sorted(set(missing) - PENDING_SECTIONS) == []
    assert sorted(PENDING_SECTIONS - set(missing)) == [], "fixed: remove it from PENDING_SECTIONS"


def test_every_dotted_name_a_module_docstring_cites_imports():
    """The same rule for the product's module docstrings (``cleanup_ops.clock.measure_offset``)."""
    problems = []
    for path in sorted(tracked_files()):
        if path.split("/", 1)[0] not in PRODUCT or not path.endswith(".py") or "/migrations/" in path:
            continue
        docstring = ast.get_docstring(ast.parse((ROOT / path).read_text())) or ""
        for span in re.findall(r"``([^`]+)``", docstring):
            problem = dotted_problem(span)
            if problem:
                problems.append(f"{path}: {problem}")
    assert problems == []


def test_the_checks_catch_what_is_false():
    assert path_problem("cleanup_ops/sql.py") is None
    assert path_problem("execution/batches.py") is None
    assert path_problem("properties/0003") is None
    assert path_problem("cleanup_ops/nothing.py")
    assert path_problem("nothing_here.py")
    assert path_problem("properties/0099")
    assert dotted_problem("cleanup_ops.downstream.decision.purge_decide") is None
    assert dotted_problem("retention.Membership") is None
    assert dotted_problem("CleanupJob.objects.due_work") is None
    assert dotted_problem("cleanup_ops.add_sweep") is None
    assert dotted_problem("cleanup_ops.add_nothing")
    assert dotted_problem("cleanup_ops.purge")
    assert dotted_problem("execution.leases.no_such_function")
    assert cited_test_problem("test_every_cited_path_exists", "test_docs.py") is None
    assert cited_test_problem("test_no_such_test", "test_docs.py")
    assert cited_test_problem("tests/test_docs.py::test_no_such_test", None)
    assert github_slug("Memberships and roles") == "memberships-and-roles"
    assert github_slug("`CLEANUP_*`: the pipeline") == "cleanup_-the-pipeline"


def test_the_readme_stays_a_front_door():
    """At most 300 lines: depth belongs in docs/, by reader."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300
