"""The configuration reference tells the truth about the settings the
product reads (on the files themselves, no database).

``docs/configuration.md`` lists every setting the product reads — each
environment variable ``config/settings.py`` (or the product's code) reads,
each Django setting the code reads with a default
(``getattr(settings, "X", default)``), and each ``settings.X`` of the
product's own prefixes (``CLEANUP_``, ``DOCSTORE_``, ``Q_``, ``RETENTION_``
…) the code reads — and no other; where the definition has a literal
default, the documented default is that value. The variables are found in
the code (``ast``), not in a list.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from functools import cache
from types import MappingProxyType

import pytest

from .repository import PRODUCT, ROOT, tracked_files

# --- the configuration reference -----------------------------------------------------

# The calls that read a variable: django-environ's and os.environ's, config/settings.py's
# strict parsers, and its broker URL check (``_broker_url("Q_REDIS_URL", …)``).
ENV_READERS = {"env_bool", "env_int", "env_float", "_broker_url", "str", "list", "bool", "int", "float"}
ENV_READERS |= {"get", "getenv"}


def literal_default(node: ast.expr | None) -> object:
    """A default written as a literal or constant arithmetic (``6 * 3600``); ``...`` when computed."""
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if all(isinstance(part, ast.BinOp | ast.Constant | ast.operator | ast.expr_context) for part in ast.walk(node)):
        return eval(compile(ast.Expression(node), "<default>", "eval"))  # noqa: S307 - constants only
    return ...


# The product's sources are read and parsed once per test process (``cache``): the
# scans below are the same for every test of this module, and the files do not change
# during a run.
@cache
def product_sources() -> tuple[tuple[str, str], ...]:
    """(path, text) of the product's modules, migrations left out."""
    return tuple(
        (path, (ROOT / path).read_text())
        for path in sorted(tracked_files())
        if path.split("/", 1)[0] in PRODUCT and path.endswith(".py") and "/migrations/" not in path
    )


def environment_reads_in(text: str) -> dict[str, object]:
    """The environment variables a module reads → each one's literal default (``...`` when computed)."""
    reads: dict[str, object] = {}
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name not in ENV_READERS:
            continue
        receiver = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
        if isinstance(func, ast.Attribute) and receiver not in {"env", "os.environ", "os"}:
            continue
        first = node.args[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            continue
        if not re.fullmatch(r"[A-Z][A-Z0-9_]+", first.value) or first.value == "DJANGO_SETTINGS_MODULE":
            continue
        default_node = node.args[1] if len(node.args) > 1 and name != "_broker_url" else None
        for keyword in node.keywords:
            if keyword.arg == "default":
                default_node = keyword.value
        reads.setdefault(first.value, literal_default(default_node))
    return reads


@cache
def environment_reads() -> Mapping[str, object]:
    """Every environment variable the product reads → its literal default (or ``...`` when computed)."""
    reads: dict[str, object] = {}
    for _path, text in product_sources():
        for name, default in environment_reads_in(text).items():
            reads.setdefault(name, default)
    return MappingProxyType(reads)


def settings_read_with_a_default_in(text: str) -> set[str]:
    """Settings read as ``getattr(settings, "X", default)``: a host may set them, settings.py does not."""
    return set(re.findall(r'getattr\(\s*settings,\s*"([A-Z][A-Z0-9_]+)"', text))


def django_settings_read_with_a_default() -> set[str]:
    return {name for _path, text in product_sources() for name in settings_read_with_a_default_in(text)}


# The prefixes of the product's own settings (Django's and the libraries' are theirs to document).
PRODUCT_PREFIXES = ("CLEANUP_", "DOCSTORE_", "Q_", "RETENTION_", "METRICS_", "CONSOLE_", "LOGIN_", "API_")
# Product settings built from others, not set by anyone: what they are made of.
DERIVED_SETTINGS = {"Q_CLUSTER": "django-q2's configuration, built from the Q_* variables"}


def product_settings_in(text: str) -> set[str]:
    """``settings.X`` a module reads, for X of the product's own (a setting defined in
    config/settings.py without a variable, such as a model or a mapping, too)."""
    return {
        name
        for name in re.findall(r"\bsettings\.([A-Z][A-Z0-9_]+)", text)
        if name.startswith(PRODUCT_PREFIXES) and name not in DERIVED_SETTINGS
    }


def product_settings_read() -> set[str]:
    return {
        name for path, text in product_sources() if path != "config/settings.py" for name in product_settings_in(text)
    }


def documented_settings() -> dict[str, str]:
    """``docs/configuration.md``'s tables: one row per setting, ``| `NAME` | default | meaning |``."""
    rows = {}
    for line in (ROOT / "docs" / "configuration.md").read_text().splitlines():
        match = re.fullmatch(r"\|\s*`([A-Z][A-Z0-9_]+)`\s*\|([^|]*)\|.*\|", line.strip())
        if match:
            name, default = match.groups()
            assert name not in rows, f"{name} is listed twice"
            rows[name] = default.strip()
    return rows


def test_the_configuration_reference_lists_every_setting_and_no_other():
    read = set(environment_reads()) | django_settings_read_with_a_default() | product_settings_read()
    documented = set(documented_settings())
    assert sorted(read - documented) == [], "read by the product but not in docs/configuration.md"
    assert sorted(documented - read) == [], "in docs/configuration.md but read nowhere"


def literal_default_text(value: object) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"{value:g}"
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ",".join(value)
    return None


def test_the_documented_defaults_are_the_definitions():
    documented = documented_settings()
    wrong = []
    for name, default in environment_reads().items():
        expected = literal_default_text(default)
        if expected is None or name not in documented:
            continue
        cell = documented[name]
        first = re.match(r"`([^`]*)`", cell)
        if expected == "":
            if not cell.startswith(("empty", "—")):
                wrong.append(f"{name}: documented {cell!r}, defined as empty")
        elif first is None or first.group(1) != expected:
            wrong.append(f"{name}: documented {cell!r}, defined as {expected!r}")
    assert wrong == []


def test_a_setting_added_any_of_these_ways_is_seen():
    module = """
import os
from django.conf import settings
env = environ.Env()
A = env_int("CLEANUP_NEW_LIMIT", 7, minimum=1)
B = env.str("RETENTION_NEW_NAME", default="x")
C = os.environ.get("NEW_PROCESS_VARIABLE")
kinds = settings.RETENTION_RECORD_KINDS
refresh = getattr(settings, "CONSOLE_NEW_SECONDS", 3)
"""
    assert environment_reads_in(module) == {
        "CLEANUP_NEW_LIMIT": 7,
        "RETENTION_NEW_NAME": "x",
        "NEW_PROCESS_VARIABLE": None,
    }
    assert product_settings_in(module) == {"RETENTION_RECORD_KINDS"}
    assert settings_read_with_a_default_in(module) == {"CONSOLE_NEW_SECONDS"}


@pytest.mark.parametrize(
    "name", ["CLEANUP_BATCH_SIZE", "DOCSTORE_URL", "Q_BROKER", "Q_REDIS_URL", "CONSOLE_REFRESH_SECONDS", "Q_AMQP_URL"]
)
def test_the_settings_scan_sees_each_way_a_setting_is_read(name):
    assert name in set(environment_reads()) | django_settings_read_with_a_default() | product_settings_read()
