"""A storage document's identity is the name the storage will act on (issue 37):
``AttachmentStore.canonical`` in Python, ``cleanup_ops_storage_name`` in
PostgreSQL (migration 0020, applied by the reference guard's trigger to the
keys the application writes). They must agree on every key a purge can take —
or the trigger takes another document's decision row than the purge, and
records no spelling for a key the purge's living check then misses.

Hypothesis generates keys out of the segments that make spellings differ
(``//``, ``.`` and ``..``, backslashes, leading and trailing slashes, blanks,
unicode) and compares the two, over S3 storages with several ``location``s
and file-system storages, the refusals included (Python raises, SQL gives
NULL). And the canonical name is a fixed point that names the same object.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import SuspiciousOperation
from django.core.files.storage import FileSystemStorage
from django.db import connection
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from storages.backends.s3 import S3Storage

from cleanup_ops.downstream.stores import S3Store, StorageStore

pytestmark = pytest.mark.django_db

SEGMENTS = st.sampled_from(
    ["", ".", "..", "...", "a", "b", "contracts", "lease-17.pdf", ".hidden", " ", "é", "日本", "\\", "a\\..\\b", "..\\"]
) | st.text(alphabet=st.characters(blacklist_categories=["Cc", "Cs"], blacklist_characters="/"), max_size=4)
SEPARATORS = st.sampled_from(["/", "//", "///", "\\", "/./", "/../"])


@st.composite
def keys(draw: st.DrawFn) -> str:
    """A key: an optional leading run of slashes, segments joined by one or
    more separators, an optional trailing slash."""
    parts = draw(st.lists(SEGMENTS, min_size=1, max_size=6))
    key = draw(st.sampled_from(["", "", "", "/", "//", "///", "./", "../"])) + parts[0]
    for part in parts[1:]:
        key += draw(SEPARATORS) + part
    return key + draw(st.sampled_from(["", "", "/", "//", "\\"]))


S3_LOCATIONS = ["", "media", "media/", "media/contracts", "a/b/"]


def s3_store(location: str) -> S3Store:
    storage = S3Storage(bucket_name="contracts", location=location, region_name="us-east-1")
    return S3Store("contracts", storage)


def python_name(store: StorageStore, key: str) -> str | None:
    try:
        return store.canonical(key)
    except (SuspiciousOperation, ValueError):
        return None


def sql_names(rule: str, location: str, keys: list[str]) -> list[str | None]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT cleanup_ops_storage_name(%s, %s, k) FROM unnest(CAST(%s AS text[])) WITH ORDINALITY AS t(k, i)"
            " ORDER BY i",
            [rule, location, keys],
        )
        return [row[0] for row in cur.fetchall()]


def purgeable(store: StorageStore, keys: list[str]) -> list[str]:
    # The keys the outbox asks the name rules about: blank, too long and
    # control characters are refused before any rule. Those the rules refuse
    # stay in: SQL must refuse them too (NULL).
    return [k for k in keys if store.key_problem(k) in (None, "refused_by_storage")]


SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(st.lists(keys(), min_size=1, max_size=40), st.sampled_from(S3_LOCATIONS))
@example(["contracts//lease-17.pdf", "contracts/lease-17.pdf", "a\\..\\b", "/b", "//b", "../b", "b/", "."], "")
@example(["../media/a", "/media/a", "a/..", "", "x/../../media/y"], "media")
def test_the_sql_name_of_an_s3_key_is_pythons(keys: list[str], location: str) -> None:
    store = s3_store(location)
    (rule, configured) = store.name_rule()
    keys = purgeable(store, keys)
    assert sql_names(rule, configured, keys) == [python_name(store, k) for k in keys]


@SETTINGS
@given(st.lists(keys(), min_size=1, max_size=40), st.sampled_from(S3_LOCATIONS))
def test_an_s3_keys_canonical_name_is_a_fixed_point_naming_the_same_object(keys: list[str], location: str) -> None:
    store = s3_store(location)
    for key in purgeable(store, keys):
        name = python_name(store, key)
        if name is None:
            continue
        assert store.canonical(name) == name
        assert store.object_key(name) == store.object_key(key)


@pytest.fixture(scope="module")
def file_system_locations(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("names")
    return [str(root / "contracts"), str(root / "a b" / "é"), "/"]


def one_file(path: str) -> str:
    return "/" + path.lstrip("/")


@SETTINGS
@given(st.lists(keys(), min_size=1, max_size=40), st.integers(min_value=0, max_value=2))
@example(["contracts//lease-17.pdf", "contracts/lease-17.pdf", "contracts/./x/../lease-17.pdf", "a/", "a/.."], 0)
def test_the_sql_name_of_a_file_system_key_is_pythons(
    file_system_locations: list[str], keys: list[str], which: int
) -> None:
    store = StorageStore("contracts", FileSystemStorage(location=file_system_locations[which]))
    (rule, configured) = store.name_rule()
    keys = purgeable(store, keys)
    assert sql_names(rule, configured, keys) == [python_name(store, k) for k in keys]
    for key in keys:
        name = python_name(store, key)
        if name is not None:
            assert store.canonical(name) == name
            # One file (POSIX keeps a leading "//", which Linux reads as "/").
            assert one_file(store.storage.path(name)) == one_file(store.storage.path(key))


def test_the_file_system_name_is_the_path_under_the_location_and_an_absolute_spelling_is_the_same_file(
    tmp_path: Path,
) -> None:
    store = StorageStore("contracts", FileSystemStorage(location=str(tmp_path)))
    inside = f"{tmp_path}/contracts//lease-17.pdf"
    assert store.canonical(inside) == "contracts/lease-17.pdf"
    assert sql_names("file_system", str(tmp_path), [inside, "../outside.pdf", "x/.."]) == [
        "contracts/lease-17.pdf",
        None,
        None,
    ]
    assert (store.key_problem("../outside.pdf"), store.key_problem("x/..")) == ("refused_by_storage",) * 2


def test_a_storage_without_name_rules_and_the_http_store_take_the_key_as_it_is() -> None:
    from django.core.files.storage import InMemoryStorage

    store = StorageStore("memory", InMemoryStorage())
    assert store.name_rule() == ("exact", "")
    assert store.canonical("a//b") == "a//b"
    assert sql_names("exact", "", ["a//b"]) == ["a//b"]
