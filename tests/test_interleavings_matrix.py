"""The interleaving suite generated over the product's surface: disposal path
x record shape x store x actor, at every checkpoint of the path.

``tests/test_interleavings.py`` enumerates every checkpoint by every actor on
the demo's lease (a bigint key, a direct property, files in the HTTP document
store). This module generates the same kind of case over the other axes, from
lists — a new shape, store or path joins by adding an entry:

- ``SHAPES``: a UUID key (``ticket``), no property (``notice``), a one-hop
  path (``visit``, its property is its unit's building), a ``DateField``
  timestamp and a NULL-able file column (``work_order``), and the demo's
  ``lease`` (the base suite's shape, here for the stores);
- ``PATHS``: the single-partition batch (``job_run_slice``), the group batch
  (``group_run_slice``) and the attachment purge, each at its checkpoints
  (``cleanup_ops.checkpoints``);
- ``STORES`` (the purge's): the HTTP document store, the file system
  (``tests.storages.LoggedFileSystemStorage``) and S3 on moto's server
  (behind ``harness.s3.S3Proxy``), each with its own log of deletions;
- ``ACTORS``: the application inserting, re-timing, moving (the shape's
  move: a unit into another building moves its visits), re-filing and
  deleting a record, each also *in flight* (its transaction open while the
  worker resumes); a move followed by a hold on the record's new property
  (the one-hop race); holds of every scope placed and released; for the
  Django storages, a living record naming the purged file in another
  spelling.

Kept out, and why (``docs/architecture.md``, "The interleaving matrix"):
the lease shape on the HTTP store is the base suite's (34 actors there); the
actors that read no record's shape — pauses, a stricter or withdrawn version,
another worker or sweep, operators, a killed session — run there, on every
path (the drop's pauses and stalls in ``tests/test_table_partitions.py``);
the store matters only to the purge, so the batch paths run on one store; a
write left in flight only where the worker's next statement reads the rows
it locks (``IN_FLIGHT_AT``); a
shape without a file (``visit``) has no purge; a kind without a property has
no move within its customer and no property hold that reaches it (placed
anyway: it must hold back nothing and break nothing); the second spelling
of a key exists only for a storage that normalises names.

Each case runs as the base suite's do (``test_interleavings.interleave``),
ends with everything drained, and is checked by the same invariant checker
over the committed history (``tests/interleaving.py``), which reads each
shape's columns from the registry and a one-hop record's property from its
unit's row at each commit instant.
"""

from __future__ import annotations

import copy
import itertools
import posixpath
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.db import DatabaseError, InterfaceError, connection, transaction
from django.db.models import Model
from psycopg import sql as pg

from cleanup_ops import checkpoints
from cleanup_ops.downstream.guard import guards_install
from cleanup_ops.execution.runner import cleanup_drain, group_run_slice, job_run_slice
from cleanup_ops.models import CleanupJob, JobKind, unpaused_q
from cleanup_ops.schedule import sweep_trigger
from harness.s3 import S3Proxy, S3Server, s3_client, storage_options
from properties.models import Lease, Portfolio, Property
from retention.registry import DEFAULT_RECORD_KINDS, get_spec, registry_reload
from retention.services import (
    legal_hold_place,
    legal_hold_release,
    policy_version_approve,
    policy_version_submit,
    retention_policy_get_or_create,
)
from tests.schema_b.models import Notice, Ticket, Unit, Visit, WorkOrder

from . import storages as test_storages
from .conftest import DocstoreProcess, make_user
from .interleaving import (
    CheckpointHold,
    Expectations,
    History,
    check_invariants,
    history_install,
    history_uninstall,
    raw_connection,
    set_actor,
)
from .record_shapes import NOTICE, TICKET, VISIT
from .test_interleavings import CAP, DAYS, IN_FLIGHT, NOW, OLD, SLOT, YOUNG, ScopeBusy, db_clock_now, interleave

pytestmark = pytest.mark.django_db(transaction=True)

# --- Shapes ----------------------------------------------------------------------------

WORK_ORDER = {
    "model": "schema_b.WorkOrder",
    "label": "Work order",
    "timestamp": "closed_on",
    "portfolio": "customer",
    "property": "building",
    "attachment": {"field": "contract_ref"},
}


@dataclass(frozen=True)
class Shape:
    """A record kind's shape: its registry entry and how the application writes its rows."""

    kind: str
    entry: dict[str, Any]
    model: type[Model]
    site: str | None  # the record's site field; None: no property, or through the unit
    timestamp: str
    document: str | None
    date: bool = False  # a DateField timestamp
    via_unit: bool = False  # a one-hop path: the site is the unit's building

    @property
    def has_property(self) -> bool:
        return self.site is not None or self.via_unit

    def when(self, at: datetime) -> Any:
        return at.date() if self.date else at

    def create(self, world: World, site: Property, *, at: datetime, document: str | None) -> Any:
        fields: dict[str, Any] = {self.timestamp: self.when(at)}
        fields["portfolio_id" if self.model is Lease else "customer_id"] = site.portfolio_id
        if self.model is Lease:
            fields |= {"unit": "1", "tenant_name": "T", "started_on": at.date()}
        if self.site:
            fields[self.site] = site
        if self.via_unit:
            fields["unit"] = world.unit_of(site)
        if self.document:
            fields[self.document] = document if document is not None else ("" if self.model is not WorkOrder else None)
        return self.model.objects.create(**fields).pk

    def update(self, key: Any, **fields: Any) -> int:
        return self.model.objects.filter(pk=key).update(**fields)

    def move(self, world: World, key: Any, to: Property) -> None:
        """The application's move of record ``key`` to site ``to``: a visit's
        unit moves into ``to`` (within a customer) or the visit to a unit of
        ``to`` (across customers); a record without a site changes customer."""
        owner = {"portfolio_id" if self.model is Lease else "customer_id": to.portfolio_id}
        record = self.model.objects.get(pk=key)
        same_customer = getattr(record, next(iter(owner))) == to.portfolio_id
        if self.via_unit and same_customer:
            Unit.objects.filter(pk=record.unit_id).update(building=to)
        elif self.via_unit:
            self.update(key, unit=world.unit_of(to), **owner)
        elif self.site:
            self.update(key, **{self.site: to}, **owner)
        else:
            self.update(key, **owner)


def _lease_entry() -> dict[str, Any]:
    return copy.deepcopy(DEFAULT_RECORD_KINDS["lease"])


SHAPES = {
    shape.kind: shape
    for shape in (
        Shape("lease", _lease_entry(), Lease, "property", "ended_at", "document_id"),
        Shape("ticket", TICKET, Ticket, "building", "resolved_at", "document_id"),
        Shape("notice", NOTICE, Notice, None, "sent_at", "document_id"),
        Shape("visit", VISIT, Visit, None, "visited_at", None, via_unit=True),
        Shape("work_order", WORK_ORDER, WorkOrder, "building", "closed_on", "contract_ref", date=True),
    )
}

# --- Stores ----------------------------------------------------------------------------


class Store:
    """A purge's store in one case: where its files are, what it deleted when."""

    name = ""
    storage_alias: str | None = None

    def document(self, tag: str) -> str:
        return f"d-{tag}"

    def other_spelling(self, name: str) -> str | None:
        """Another name the store reads as ``name`` (None: names are ids)."""
        return None

    def canonical(self, name: str) -> str:
        return name

    def ref_key(self, ref: str) -> str:
        return ref

    def create(self, *names: str) -> None:
        raise NotImplementedError

    def deletions(self) -> list[tuple[str, datetime]]:
        raise NotImplementedError

    def documents(self) -> set[str]:
        raise NotImplementedError


class HttpStore(Store):
    name = "http"

    def __init__(self, process: DocstoreProcess) -> None:
        self.process = process

    def create(self, *names: str) -> None:
        self.process.create(*names)

    def deletions(self) -> list[tuple[str, datetime]]:
        return [
            (r["path"].rsplit("/", 1)[1], datetime.fromtimestamp(r["at"], tz=UTC))
            for r in self.process.requests()
            if r["status"] == 204 and not r.get("replayed")
        ]

    def documents(self) -> set[str]:
        return self.process.documents()


class DjangoStore(Store):
    """A Django storage (``STORAGES["matrix"]``): names are keys it normalises."""

    storage_alias = "matrix"

    def document(self, tag: str) -> str:
        return f"docs/d-{tag}.pdf"

    def other_spelling(self, name: str) -> str | None:
        head, tail = name.split("/", 1)
        return f"{head}//{tail}"

    def canonical(self, name: str) -> str:
        # The reference rule, independent of the product's: a POSIX path's normal form.
        return posixpath.normpath(name)

    def ref_key(self, ref: str) -> str:
        return ref.split(":", 1)[1] if ref.startswith(f"{self.storage_alias}:") else ref

    def create(self, *names: str) -> None:
        storage = storages[self.storage_alias]
        for name in names:
            assert storage.save(name, ContentFile(b"%PDF-1.7")) == name


class FileSystemStore(DjangoStore):
    name = "fs"

    def __init__(self, root: Path) -> None:
        self.root = root / "files"
        self.root.mkdir()
        self.log = str(root / "deleted.log")
        self.backend = {
            "BACKEND": "tests.storages.LoggedFileSystemStorage",
            "OPTIONS": {"location": str(self.root), "log": self.log},
        }

    def deletions(self) -> list[tuple[str, datetime]]:
        return [(name, datetime.fromtimestamp(at, tz=UTC)) for name, at in test_storages.deletions(self.log)]

    def documents(self) -> set[str]:
        return {str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file()}


class S3Store(DjangoStore):
    name = "s3"

    def __init__(self, proxy: S3Proxy, bucket: str) -> None:
        self.proxy, self.bucket = proxy, bucket
        self.backend = {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": storage_options(proxy.endpoint, bucket)}

    def deletions(self) -> list[tuple[str, datetime]]:
        return [(key, datetime.fromtimestamp(at, tz=UTC)) for key, at in self.proxy.deleted]

    def documents(self) -> set[str]:
        client = s3_client(self.proxy.upstream.geturl())
        return {o["Key"] for o in client.list_objects_v2(Bucket=self.bucket).get("Contents", [])}


# --- Paths and actors ------------------------------------------------------------------

PATHS = {
    "single": ("lease.after_cap_lock", *checkpoints.BATCH),
    "group": ("lease_group.after_stripe_locks", *checkpoints.BATCH),
    "purge": checkpoints.PURGE,
}

APPLICATION = (
    "application-inserts-an-old-row",
    "application-retimes-it",
    "application-moves-it-within-the-customer",
    "application-moves-it-to-another-customer",
    "application-refiles-it",
    "application-deletes-it",
)
HOLD_SCOPES = ("portfolio", "property", "kind", "record")
ACTORS = (
    *APPLICATION,
    *(actor + IN_FLIGHT for actor in APPLICATION),
    "application-moves-it-then-a-hold-on-its-new-property-commits",
    *(f"reviewer-places-{scope}-hold" for scope in HOLD_SCOPES),
    *(f"reviewer-releases-{scope}-hold" for scope in HOLD_SCOPES),
    "application-names-the-file-in-another-spelling",
)


# Where a write left in flight means more than the same write committed: the
# worker's next statement reads or deletes the rows it holds locked (the
# DELETE after the fence or before it; the purge's living-reference and hold
# reads after its locks). Elsewhere the worker next commits or releases.
IN_FLIGHT_AT = frozenset(
    {"batch.after_fence", "batch.before_delete", "purge.after_decision_lock", "purge.after_scope_lock"}
)


def meaningful(path: str, checkpoint: str, shape: Shape, store: str, actor: str) -> bool:
    """The combinations kept (the module docstring says why the others go)."""
    base = actor.removesuffix(IN_FLIGHT)
    if actor.endswith(IN_FLIGHT) and checkpoint not in IN_FLIGHT_AT:
        return False
    if path == "purge" and shape.document is None:
        return False  # nothing to purge
    if path != "purge" and store != "http":
        return False  # a batch calls no store
    if shape.kind == "lease" and store == "http":
        return False  # the base suite's row
    if path == "purge" and shape.kind != "lease" and store != "http":
        return False  # a store's keys are the store's, whatever the shape: the lease carries them
    if base == "application-names-the-file-in-another-spelling":
        return path == "purge" and store != "http"
    if base == "application-refiles-it" and shape.document is None:
        return False
    if not shape.has_property and (
        base == "application-moves-it-within-the-customer" or actor.endswith("then-a-hold-on-its-new-property-commits")
    ):
        return False
    return True


CASES = [
    pytest.param(path, checkpoint, kind, store, actor, id=f"{path}-{kind}-{store}-{checkpoint}-{actor}")
    for path, cps in PATHS.items()
    for kind, store, actor in itertools.product(SHAPES, ("http", "fs", "s3"), ACTORS)
    for checkpoint in cps
    if meaningful(path, checkpoint, SHAPES[kind], store, actor)
]

# --- The estate ------------------------------------------------------------------------

RECORDS = (  # tag, site, ended, file tag
    ("R1", "a1", OLD, "shared"),
    ("R2", "a1", OLD, "own"),
    ("Y1", "a1", YOUNG, "young"),
    ("R3", "a2", OLD, "shared"),
    ("R4", "b1", OLD, "b"),
)


@dataclass
class World:
    path: str
    checkpoint: str
    shape: Shape
    store: Store
    actor: str
    sites: dict[str, Property] = field(default_factory=dict)
    units: dict[int, Unit] = field(default_factory=dict)
    records: dict[str, Any] = field(default_factory=dict)
    pre_hold: int | None = None
    wrote: threading.Event = field(default_factory=threading.Event)
    commit: threading.Event = field(default_factory=threading.Event)
    threads: tuple[Any, Any] = (None, None)

    def unit_of(self, site: Property) -> Unit:
        if site.pk not in self.units:
            self.units[site.pk] = Unit.objects.create(building=site, name=f"unit of {site.name}")
        return self.units[site.pk]

    @property
    def kind(self) -> str:
        return self.shape.kind

    @property
    def in_flight(self) -> bool:
        return self.actor.endswith(IN_FLIGHT)

    def build(self) -> None:
        self.manager = make_user("manager", "property_manager")
        self.reviewer = make_user("reviewer", "compliance_reviewer")
        a = Portfolio.objects.create(name="A", slug="a")
        b = Portfolio.objects.create(name="B", slug="b")
        self.a, self.b = a, b
        for portfolio in (a, b):
            policy = retention_policy_get_or_create(portfolio=portfolio, record_kind=self.kind)
            version = policy_version_submit(
                policy=policy, retention_days=DAYS, author=self.manager, reason="a policy of the matrix"
            )
            policy_version_approve(version_id=version.pk, reviewer=self.reviewer, note="approved for the matrix")
        self.sites = {
            "a1": Property.objects.create(portfolio=a, name="A1"),
            "a2": Property.objects.create(portfolio=a, name="A2"),
            "b1": Property.objects.create(portfolio=b, name="B1"),
        }
        files = set()
        for tag, site, ended, file_tag in RECORDS:
            document = self.store.document(file_tag) if self.shape.document else None
            self.records[tag] = self.shape.create(self, self.sites[site], at=ended, document=document)
            files.add(document)
        spelling = self.store.other_spelling(self.store.document("own")) if self.shape.document else None
        if spelling:
            # A living young record of A2 names R2's file in another spelling of
            # its key from the start: one object, so no path may delete it.
            self.records["S1"] = self.shape.create(self, self.sites["a2"], at=YOUNG, document=spelling)
        if self.shape.document:
            self.store.create(*sorted(f for f in files if f))
        if self.actor == "reviewer-releases-record-hold":
            self._pre_hold()  # a record hold names a record that exists: before the batch
        sweep_trigger(slot=SLOT, now=NOW)
        if self.path == "purge":
            while group_run_slice(owner="setup").leased:
                pass
        if self.actor.startswith("reviewer-releases") and self.pre_hold is None:
            self._pre_hold()

    def _pre_hold(self) -> None:
        """A hold on B's records, released by the actor while the worker is held."""
        scope = self.actor.rsplit("-", 2)[-2]
        kwargs: dict[str, Any] = {"portfolio": self.b}
        if scope == "property":
            kwargs["property"] = self.sites["b1"]
        elif scope == "kind":
            kwargs["record_kind"] = self.kind
        elif scope == "record":
            kwargs |= {"record_kind": self.kind, "record_id": str(self.records["R4"])}
            if self.shape.has_property:
                kwargs["property"] = self.sites["b1"]
        self.pre_hold = legal_hold_place(placed_by=self.reviewer, reason="placed before the case", **kwargs).pk

    def job(self, kind: str = JobKind.DELETE) -> CleanupJob:
        """A1's job (A's, for a kind without a property)."""
        jobs = CleanupJob.objects.filter(portfolio_id=self.a.pk, record_kind=self.kind, job_kind=kind)
        if self.shape.has_property:
            jobs = jobs.filter(property_id=self.sites["a1"].pk)
        job = jobs.order_by("-id").first()
        assert job is not None, f"setup: no {kind} job of A1"
        return job

    # -- the worker held at the checkpoint ----------------------------------------------

    def subject(self) -> Callable[[], Any]:
        if self.path == "group":
            return lambda: group_run_slice(owner="w1", max_jobs=2)
        job_id = self.job(JobKind.PURGE if self.path == "purge" else JobKind.DELETE).pk
        return lambda: job_run_slice(job_id=job_id, owner="w1")

    # -- the actor ------------------------------------------------------------------------

    def target(self) -> Any:
        """The first expired record of A1 while its batch is still to run; the
        surviving young one on the purge path (its batch already ran)."""
        return self.records["Y1" if self.path == "purge" else "R1"]

    def act(self, worker_pid: int) -> Callable[[], Any]:
        name = self.actor.removesuffix(IN_FLIGHT)
        if name.startswith("reviewer-places-"):
            return self._hold(name.split("-")[2])
        if name.startswith("reviewer-releases-"):
            return self._release()
        return getattr(self, "_" + name.replace("-", "_"))()

    def _app(self, change: Callable[[], Any]) -> Callable[[], Any]:
        wrote, commit, in_flight = self.wrote, self.commit, self.in_flight

        def run() -> Any:
            with transaction.atomic():
                set_actor("app")
                result = change()
                wrote.set()
                if in_flight:
                    assert commit.wait(60), "never told to commit"
                return result

        return run

    def _application_inserts_an_old_row(self) -> Callable[[], Any]:
        document = self.store.document("shared") if self.shape.document else None
        a1 = self.sites["a1"]
        return self._app(lambda: self.shape.create(self, a1, at=OLD, document=document))

    def _application_retimes_it(self) -> Callable[[], Any]:
        target, shape = self.target(), self.shape
        return self._app(lambda: shape.update(target, **{shape.timestamp: shape.when(NOW + timedelta(days=400))}))

    def _application_moves_it_within_the_customer(self) -> Callable[[], Any]:
        target, to = self.target(), self.sites["a2"]
        return self._app(lambda: self.shape.move(self, target, to))

    def _application_moves_it_to_another_customer(self) -> Callable[[], Any]:
        target, to = self.target(), self.sites["b1"]
        return self._app(lambda: self.shape.move(self, target, to))

    def _application_refiles_it(self) -> Callable[[], Any]:
        target, shape = self.target(), self.shape
        document = self.store.document("shared" if self.path == "purge" else "new")
        return self._app(lambda: shape.update(target, **{str(shape.document): document}))

    def _application_deletes_it(self) -> Callable[[], Any]:
        target, model = self.target(), self.shape.model
        return self._app(lambda: model.objects.filter(pk=target).delete())

    def _application_moves_it_then_a_hold_on_its_new_property_commits(self) -> Callable[[], Any]:
        """The one-hop race: the record (a visit: its unit) moves into A2 and
        commits; a reviewer then holds A2, and that commits too — all while
        the worker is held. Whatever the worker read before, the record is
        now under a hold."""
        move = self._app(lambda: self.shape.move(self, self.target(), self.sites["a2"]))
        reviewer, a, a2 = self.reviewer, self.a, self.sites["a2"]

        def run() -> Any:
            move()
            return legal_hold_place(placed_by=reviewer, reason="placed on the new site", portfolio=a, property=a2).pk

        return run

    def _hold(self, scope: str) -> Callable[[], Any]:
        kwargs: dict[str, Any] = {"portfolio": self.a}
        if scope == "property":
            kwargs["property"] = self.sites["a1"]
        elif scope == "kind":
            kwargs["record_kind"] = self.kind
        elif scope == "record":
            kwargs |= {"record_kind": self.kind, "record_id": str(self.target())}
            if self.shape.has_property:
                kwargs["property"] = self.sites["a1"]
        reviewer = self.reviewer
        return lambda: legal_hold_place(placed_by=reviewer, reason="placed during the case", **kwargs).pk

    def _release(self) -> Callable[[], Any]:
        hold, reviewer = self.pre_hold, self.reviewer
        return lambda: legal_hold_release(hold_id=hold, released_by=reviewer, reason="released during the case").pk

    def _application_names_the_file_in_another_spelling(self) -> Callable[[], Any]:
        """A young record of A2 names R2's file (purged now) in another spelling
        of its key: one object, so it must stay."""
        spelling = self.store.other_spelling(self.store.document("own"))
        a2 = self.sites["a2"]
        return self._app(lambda: self.shape.create(self, a2, at=YOUNG, document=spelling))

    def subject_may_raise(self) -> tuple[type[BaseException], ...]:
        return ()

    def actor_may_raise(self) -> tuple[type[BaseException], ...]:
        from django.core.exceptions import ValidationError

        return (ScopeBusy, ValidationError, DatabaseError, InterfaceError)


# --- Fixtures --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def http_process(tmp_path_factory) -> Iterator[DocstoreProcess]:  # type: ignore[no-untyped-def]
    process = DocstoreProcess(str(tmp_path_factory.mktemp("matrix") / "docstore.sqlite3"))
    yield process
    process.stop()


@pytest.fixture(scope="module")
def moto() -> Iterator[S3Server]:
    with S3Server() as server:
        yield server


@pytest.fixture
def matrix_store(request, http_process, tmp_path, settings) -> Iterator[Store]:  # type: ignore[no-untyped-def]
    """The case's store: the HTTP document store always answers (other kinds'
    files live there); ``fs`` and ``s3`` are ``STORAGES["matrix"]``."""
    http_process._admin("POST", "reset")
    settings.DOCSTORE_URL = http_process.url
    name = request.node.callspec.params["store"]
    if name == "http":
        yield HttpStore(http_process)
        return
    if name == "fs":
        store: DjangoStore = FileSystemStore(tmp_path)
        settings.STORAGES = {**settings.STORAGES, "matrix": store.backend}
        yield store
        return
    moto = request.getfixturevalue("moto")
    bucket = f"matrix-{abs(hash(request.node.name)) % 10**10}"
    s3_client(moto.endpoint).create_bucket(Bucket=bucket)
    with S3Proxy(moto.endpoint) as proxy:
        store = S3Store(proxy, bucket)
        settings.STORAGES = {**settings.STORAGES, "matrix": store.backend}
        yield store


@pytest.fixture
def matrix_settings(request, settings, matrix_store, time_machine):  # type: ignore[no-untyped-def]
    shape = SHAPES[request.node.callspec.params["kind"]]
    entry = copy.deepcopy(shape.entry)
    if matrix_store.storage_alias and shape.document:
        entry["attachment"] = {"field": shape.document, "storage": matrix_store.storage_alias}
    settings.RETENTION_RECORD_KINDS = {**DEFAULT_RECORD_KINDS, shape.kind: entry}
    registry_reload()
    # As migrate does for an adopter's kinds: the reference guard on the case's
    # table, with its store's arguments (undone below: other modules' kinds).
    guards_before = _guards()
    guards_install()
    settings.CLEANUP_PORTFOLIO_MAX_LEASES = CAP
    settings.CLEANUP_SCOPE_LOCK_WAIT_SECONDS = 1.0
    settings.CLEANUP_TOKEN_WAIT_SECONDS = 0.0
    settings.CLEANUP_CHECKPOINTS = frozenset()
    time_machine.move_to(NOW, tick=False)
    history_install()  # after the registry: it logs the case's kind (and a visit's units)
    yield settings
    history_uninstall()
    del settings.RETENTION_RECORD_KINDS
    registry_reload()
    guards_install()
    with connection.cursor() as cur:
        for table, name in _guards() - guards_before:
            cur.execute(pg.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(pg.Identifier(name), pg.Identifier(table)))


def _guards() -> set[tuple[str, str]]:
    """(table, trigger) of every reference guard in the database."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " WHERE t.tgname LIKE 'cleanup_ops_guard_%%'"
        )
        return {(str(table), str(name)) for table, name in cur.fetchall()}


# --- The case --------------------------------------------------------------------------


def test_the_matrix_has_every_path_shape_store_and_actor() -> None:
    kept = {(c.values[0], c.values[2], c.values[3]) for c in CASES}
    assert {path for path, _, _ in kept} == set(PATHS)
    assert {kind for _, kind, _ in kept} == set(SHAPES)
    assert {store for path, _, store in kept if path == "purge"} == {"http", "fs", "s3"}
    assert {c.values[4] for c in CASES} == set(ACTORS)


@pytest.mark.parametrize(("path", "checkpoint", "kind", "store", "actor"), CASES)
def test_a_disposal_held_at_any_checkpoint_keeps_every_invariant_on_every_shape_and_store(
    path, checkpoint, kind, store, actor, matrix_settings, matrix_store, time_machine
):
    world = World(path=path, checkpoint=checkpoint, shape=SHAPES[kind], store=matrix_store, actor=actor)
    assert get_spec(kind).attachment_storage == matrix_store.storage_alias or not SHAPES[kind].document
    world.build()
    subject = world.subject()

    since = db_clock_now()
    matrix_settings.CLEANUP_CHECKPOINTS = frozenset({checkpoint})
    hold = CheckpointHold(checkpoint)
    observer = raw_connection()
    try:
        interleave(world, subject, hold, observer)  # type: ignore[arg-type]  # the base suite's World, by shape
    finally:
        hold.release()
        world.commit.set()
        observer.close()
    worker, acting = world.threads
    if worker.error is not None and not isinstance(worker.error, world.subject_may_raise()):
        raise worker.error
    if acting.error is not None and not isinstance(acting.error, world.actor_may_raise()):
        raise acting.error

    matrix_settings.CLEANUP_CHECKPOINTS = frozenset()
    boundary = db_clock_now()
    later = NOW + timedelta(minutes=30)
    time_machine.move_to(later, tick=False)
    cleanup_drain()
    left = CleanupJob.objects.due(now=later).filter(unpaused_q())
    assert not left.exists(), list(left.values("id", "job_kind", "state", "available_at", "attempt"))

    expectations = Expectations(
        cap=CAP,
        pipeline_now=lambda at: NOW if at < boundary else later,
        store_deletes=matrix_store.deletions(),
        store_documents=matrix_store.documents(),
        since=since,
        canonical=matrix_store.canonical,
        ref_key=matrix_store.ref_key,
    )
    check_invariants(History(), expectations).check()
