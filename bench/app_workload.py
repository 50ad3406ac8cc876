"""The application ``bench/app_impact.py`` runs next to the cleanup: its rows and its load.

``add_application_rows`` adds to the backlog dataset what an application reads and
writes that the sweep never deletes (portfolios without a policy, running leases, open
maintenance records) and returns the id ranges ``AppScope`` hands to the pgbench
scripts; ``AppLoad`` runs ``SCRIPTS`` with pgbench in back-to-back chunks and reads its
per-transaction logs back as ``Txn`` tuples. Apart from ``app_impact.py`` (the phases
and the server's figures) and ``app_report.py`` (the statistics and the tables), so
that each reads as one job.
"""

# ruff: noqa: S603 - runs pgbench by design

from __future__ import annotations

import shutil
import subprocess
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bench.common import sql
from bench.dataset import KIND, Dataset, kind_stats

# (end epoch, latency ms from the scheduled start, schedule lag ms, script index)
Txn = tuple[float, float, float, int]
CHUNK_SECONDS = 4  # pgbench runs in chunks this long, so each chunk's log is complete when it exits

# name -> (weight, script). Variables come from -D (see AppLoad._argv).
SCRIPTS: dict[str, tuple[int, str]] = {
    "read": (
        50,
        "\\set prop random(:prop_lo, :prop_hi)\n"
        "SELECT id, unit, tenant_name, started_on FROM properties_lease"
        " WHERE property_id = :prop AND (ended_at IS NULL OR ended_at > now()) ORDER BY id LIMIT 100;\n",
    ),
    "insert": (
        30,
        "\\set prop random(:prop_lo, :prop_hi)\n"
        "INSERT INTO properties_tenantactivity (portfolio_id, property_id, activity_type, details, occurred_at)"
        " SELECT portfolio_id, id, 'portal_login', 'pgbench', now() FROM properties_property WHERE id = :prop;\n",
    ),
    "maint-cleaned": (
        10,
        "\\set mid random(:mc_lo, :mc_hi)\n"
        "BEGIN;\n"
        "SELECT id, summary FROM properties_maintenancerecord WHERE id = :mid FOR UPDATE;\n"
        "UPDATE properties_maintenancerecord SET summary = 'visit ' || :mid WHERE id = :mid;\n"
        "COMMIT;\n",
    ),
    "maint-quiet": (
        10,
        "\\set mid random(:mq_lo, :mq_hi)\n"
        "BEGIN;\n"
        "SELECT id, summary FROM properties_maintenancerecord WHERE id = :mid FOR UPDATE;\n"
        "UPDATE properties_maintenancerecord SET summary = 'visit ' || :mid WHERE id = :mid;\n"
        "COMMIT;\n",
    ),
}


# --------------------------------------------------------------------------- dataset


@dataclass
class AppScope:
    """Id ranges the pgbench scripts draw from (contiguous by construction)."""

    prop_lo: int
    prop_hi: int
    mc_lo: int  # maintenance records in cleaned portfolios
    mc_hi: int
    mq_lo: int  # ... in quiet portfolios (no policy)
    mq_hi: int
    quiet_portfolios: int
    big_portfolio: int


def add_application_rows(ds: Dataset, big_portfolio: int, quiet: int, maintenance: int, slot: datetime) -> AppScope:
    """Quiet portfolios (no policy) with running leases, and open maintenance records in
    every property; then the dataset's lease figures again (the totals changed)."""
    from properties.models import Portfolio, Property

    first_prop = sql("SELECT min(id) FROM properties_property")[0][0]
    pos = Portfolio.objects.bulk_create(
        [Portfolio(name=f"Quiet Lettings {i}", slug=f"quiet-{i:03d}") for i in range(1, quiet + 1)]
    )
    Property.objects.bulk_create([Property(portfolio=po, name=f"{po.slug} house {i}") for po in pos for i in (1, 2, 3)])
    quiet_ids = [po.pk for po in pos]
    last_prop = sql("SELECT max(id) FROM properties_property")[0][0]
    # Running leases in the quiet portfolios (NULL ended_at): read by the application, never eligible.
    sql(
        f"INSERT INTO {ds.kinds[KIND].table} (portfolio_id, property_id, unit, tenant_name, started_on, ended_at)"
        " SELECT p.portfolio_id, p.id, 'Q-' || g, 'Quiet tenant ' || g, (%s::timestamptz - interval '200 days')::date,"
        " NULL FROM properties_property p CROSS JOIN generate_series(1, 40) g"
        " WHERE p.portfolio_id = ANY(%s) ORDER BY g, p.id",
        [slot, quiet_ids],
    )
    ranges: dict[bool, tuple[int, int]] = {}
    for is_quiet in (False, True):
        sql(
            "INSERT INTO properties_maintenancerecord (portfolio_id, property_id, summary, opened_at, closed_at)"
            " SELECT p.portfolio_id, p.id, 'open work order ' || g, %s::timestamptz - g * interval '1 hour', NULL"
            " FROM properties_property p CROSS JOIN generate_series(1, %s) g"
            f" WHERE {'' if is_quiet else 'NOT'} (p.portfolio_id = ANY(%s)) ORDER BY g, p.id",
            [slot, maintenance, quiet_ids],
        )
        lo, hi = sql(
            "SELECT min(id), max(id) FROM properties_maintenancerecord WHERE"
            f" {'' if is_quiet else 'NOT'} (portfolio_id = ANY(%s))",
            [quiet_ids],
        )[0]
        ranges[is_quiet] = (lo, hi)
    sql("VACUUM ANALYZE properties_lease")
    sql("VACUUM ANALYZE properties_maintenancerecord")
    ds.kinds[KIND] = kind_stats(KIND, ds.cutoff)
    return AppScope(
        first_prop, last_prop, *ranges[False], *ranges[True], quiet_portfolios=quiet, big_portfolio=big_portfolio
    )


# --------------------------------------------------------------------------- pgbench


class AppLoad:
    """pgbench against the benchmark database in back-to-back chunks of ``CHUNK_SECONDS``
    while running; every chunk writes a per-transaction log that is complete when it
    exits (pgbench has no signal handler that flushes a log cut short)."""

    def __init__(self, url: str, scope: AppScope, *, rate: float, clients: int, work: Path) -> None:
        self.url = url
        self.scope = scope
        self.rate = rate
        self.clients = clients
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)
        self.files: list[Path] = []
        for name, (_weight, text) in SCRIPTS.items():
            path = work / f"{name}.sql"
            path.write_text(text)
            self.files.append(path)
        self.prefixes: list[Path] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._n = 0

    def _argv(self, prefix: Path) -> list[str]:
        s = self.scope
        argv = [
            shutil.which("pgbench") or "pgbench",
            "-n",  # no VACUUM of pgbench's own tables (there are none)
            "-c",
            str(self.clients),
            "-j",
            str(min(2, self.clients)),
            "-T",
            str(CHUNK_SECONDS),
            "-l",
            f"--log-prefix={prefix}",
        ]
        if self.rate > 0:
            argv += ["-R", str(self.rate)]
        for name, d in (
            ("prop_lo", s.prop_lo),
            ("prop_hi", s.prop_hi),
            ("mc_lo", s.mc_lo),
            ("mc_hi", s.mc_hi),
            ("mq_lo", s.mq_lo),
            ("mq_hi", s.mq_hi),
        ):
            argv += ["-D", f"{name}={d}"]
        for path, (_weight, _text) in zip(self.files, SCRIPTS.values(), strict=True):
            argv += ["-f", f"{path}@{_weight}"]
        return [*argv, self.url]

    def _chunk(self) -> None:
        self._n += 1
        prefix = self.work / f"chunk{self._n:04d}"
        self.prefixes.append(prefix)
        out = subprocess.run(self._argv(prefix), cwd=self.work, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            self.errors.append(f"pgbench exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}")

    def start(self) -> None:
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                self._chunk()

        self._thread = threading.Thread(target=loop, name="pgbench", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Let the running chunk finish (its log complete) and start no other."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def transactions(self) -> list[Txn]:
        """(end epoch, latency ms, schedule lag ms, script index) of every logged transaction."""
        out = []
        for prefix in self.prefixes:
            for path in prefix.parent.glob(prefix.name + ".*"):
                for line in path.read_text().splitlines():
                    f = line.split()
                    # client_id transaction_no time script_no time_epoch time_us [schedule_lag]
                    if len(f) < 6 or not f[2].isdigit():
                        continue  # "skipped" transactions (-L) and anything unexpected
                    end = int(f[4]) + int(f[5]) / 1e6
                    lag = int(f[6]) / 1000 if len(f) > 6 and f[6].isdigit() else 0.0
                    out.append((end, int(f[2]) / 1000, lag, int(f[3])))
        return out

    def reset(self) -> None:
        for prefix in self.prefixes:
            for path in prefix.parent.glob(prefix.name + ".*"):
                path.unlink()
        self.prefixes = []
        self.errors = []
