"""The figures of ``bench/app_impact.py``: the application's statistics per phase and the report.

``stats_from`` turns pgbench's logged transactions into an ``AppStats`` (only those
that ended inside a run's windows, nearest-rank ``percentile``); a ``Phase`` collects
one phase's runs; ``per_batch_lines`` and ``report`` print the tables, the statements
per batch and the verdict against ``P99_GOAL`` and the next slot. Apart from the
phases that measure (``app_impact.py``) and the workload (``app_workload.py``): pure
arithmetic and printing, tested without a database (``tests/test_bench_app_impact.py``).
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from bench.app_workload import SCRIPTS, AppScope, Txn
from bench.dataset import Dataset

P99_GOAL = 1.2  # the goal: application p99 within 1.2 x its idle p99 with a limit set
ONE_MILLION_ELIGIBLE = 950_487  # eligible rows of the 1M backlog dataset (bench/pipeline.py --rows 1000000)


@dataclass
class AppStats:
    """The application's transactions that ended inside the windows of one phase."""

    seconds: float
    transactions: int
    tps: float
    p50_ms: float
    p99_ms: float
    p99_by_script_ms: dict[str, float]
    lag_p99_ms: float
    errors: list[str] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0-100) of sorted ``values``."""
    if not values:
        return float("nan")
    rank = max(1, math.ceil(q / 100 * len(values)))
    return values[min(rank, len(values)) - 1]


def stats_from(rows: list[Txn], windows: list[tuple[float, float]], errors: list[str]) -> AppStats:
    inside = [t for t in rows if any(a <= t[0] <= b for a, b in windows)]
    seconds = sum(b - a for a, b in windows)
    lat = sorted(t[1] for t in inside)
    return AppStats(
        seconds=round(seconds, 2),
        transactions=len(inside),
        tps=round(len(inside) / seconds, 1) if seconds else 0.0,
        p50_ms=round(percentile(lat, 50), 2),
        p99_ms=round(percentile(lat, 99), 2),
        p99_by_script_ms={
            name: round(percentile(sorted(t[1] for t in inside if t[3] == i), 99), 2) for i, name in enumerate(SCRIPTS)
        },
        lag_p99_ms=round(percentile(sorted(t[2] for t in inside), 99), 2),
        errors=list(errors),
    )


@dataclass
class Phase:
    name: str
    label: str
    app: AppStats
    runs: int = 0
    cleanup_seconds: list[float] = field(default_factory=list)
    rows_deleted: int = 0
    ok: bool = True
    statements: int | None = None
    wal_cleanup_bytes: int = 0
    wal_app_bytes: int = 0
    wal_lsn_bytes: int = 0
    transactions: int = 0
    transactions_big: int = 0
    other_cpu_cores: float = 0.0
    load_average: float = 0.0
    # CPU seconds of our processes and our PostgreSQL over the runs' windows (the
    # application's included; report() takes off what the idle application used).
    cpu_seconds: float = 0.0
    limits: tuple[float, float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def wal_per_row(self) -> float | None:
        return self.wal_cleanup_bytes / self.rows_deleted if self.rows_deleted else None


PER_BATCH_GOAL = 1.5  # statements per batch under a limit, against the unlimited run with as many workers


def statements_per_batch(p: Phase, cls: str | None = None) -> float | None:
    """The cleanup's statements (or those of one class) per batch transaction of ``p``."""
    if p.statements is None or not p.transactions or not p.runs:
        return None
    per_run = p.statements if cls is None else p.extra.get("statements_by_class_per_run", {}).get(cls, 0)
    return per_run / (p.transactions / p.runs)


def unlimited_of(p: Phase) -> str:
    """The name of the unlimited phase a limited one is compared with: q2lim-5-3 -> q2."""
    return p.name.split("lim", 1)[0]


def per_batch_lines(results: list[Phase]) -> list[str]:
    """One line per qcluster phase: statements per batch, the rate-token and
    BEGIN/COMMIT shares, and for a limited phase the ratio to the unlimited one."""
    by_name = {p.name: p for p in results}
    lines = []
    for p in results:
        total = statements_per_batch(p)
        if total is None:
            continue
        tokens = statements_per_batch(p, "rate tokens") or 0.0
        control = statements_per_batch(p, "transaction control") or 0.0
        line = (
            f"  {p.label}: {total:.1f} per batch (rate tokens {tokens:.2f}, BEGIN/COMMIT {control:.1f});"
            f" {p.transactions // p.runs} batches a run"
        )
        base = by_name.get(unlimited_of(p)) if p.limits else None
        base_total = statements_per_batch(base) if base is not None else None
        if base_total:
            ratio = total / base_total
            line += f"; {ratio:.2f}x the unlimited run ({'met' if ratio <= PER_BATCH_GOAL else 'MISSED'})"
        lines.append(line)
    return lines


def _cleanup_cores(p: Phase, app_cores: float) -> str:
    span = sum(p.cleanup_seconds)
    if not span or not p.cpu_seconds:
        return "-"
    return f"{max(0.0, p.cpu_seconds - app_cores * span) / span:.2f}"


def report(
    results: list[Phase],
    idle: Phase | None,
    *,
    ds: Dataset,
    args: argparse.Namespace,
    code: str,
    slot_hours: float,
    scope: AppScope,
) -> None:
    rate = f"{args.app_rate:g} tx/s open loop" if args.app_rate else "closed loop"
    print(
        f"\n=== bench/app_impact.py: {ds.total:,} leases ({ds.eligible:,} eligible), batch {args.batch_size};"
        f" application {rate}, {args.app_clients} connections; code: {code} ==="
    )
    print(
        f"slot interval {slot_hours:g} h; p99 goal <= {P99_GOAL}x the idle p99;"
        f" 1M projection: {ONE_MILLION_ELIGIBLE:,} eligible rows"
    )
    width = max(len(p.label) for p in results) if results else 10
    head = (
        f"{'phase':<{width}} {'runs':>4} {'cleanup s':>9} {'app tx/s':>8} {'p50 ms':>7} {'p99 ms':>7}"
        f" {'vs idle':>7} {'read':>6} {'insert':>6} {'m-cln':>6} {'m-qt':>6} {'WAL B/row':>9} {'stmts':>6}"
        f" {'cores':>5} {'other cpu':>9} {'load':>5}"
    )
    print(head)
    print("-" * len(head))
    base = idle.app.p99_ms if idle else None
    app_cores = float(idle.extra.get("app_cpu_cores", 0.0)) if idle else 0.0
    for p in results:
        s = p.app
        vs = f"{s.p99_ms / base:.2f}x" if base else "-"
        per = [f"{s.p99_by_script_ms.get(n, float('nan')):6.1f}" for n in SCRIPTS]
        secs = f"{statistics.median(p.cleanup_seconds):.2f}" if p.cleanup_seconds else "-"
        wal = f"{p.wal_per_row:9.0f}" if p.wal_per_row is not None else f"{'-':>9}"
        print(
            f"{p.label:<{width}} {p.runs:>4} {secs:>9} {s.tps:8.1f} {s.p50_ms:7.2f} {s.p99_ms:7.2f} {vs:>7}"
            f" {' '.join(per)} {wal} {p.statements if p.statements is not None else '-':>6}"
            f" {_cleanup_cores(p, app_cores):>5} {p.other_cpu_cores:9.2f} {p.load_average:5.2f}"
        )
    print(
        "\n(p99 per script: read = a property's active leases; insert = tenant activity; m-cln / m-qt = maintenance"
        " update in a cleaned / quiet portfolio. WAL B/row: pg_stat_statements.wal_bytes of the cleanup's roles /"
        " rows deleted, full_page_writes off. stmts: the cleanup's statements per run (pg_stat_statements, BEGIN/COMMIT"
        " included, the application's left out). cores: CPU the cleanup used (our processes and PostgreSQL during"
        " the run, less what the idle application used). other cpu: cores other processes on the machine used"
        " meanwhile. cleanup s: median of the runs; every run is listed below.)"
    )
    if idle and idle.extra.get("windows"):
        # The noise floor: how much the idle p99 itself moves from window to window here.
        spread = [w["p99_ms"] for w in idle.extra["windows"]]
        print(
            f"  idle p99 per window: {'/'.join(f'{x:.2f}' for x in spread)} ms"
            f" (max/min {max(spread) / min(spread):.2f}x; the pooled figure is the baseline)"
        )
    for p in results:
        if len(p.cleanup_seconds) > 1:
            print(f"  {p.label}: runs {'/'.join(f'{x:.2f}' for x in p.cleanup_seconds)} s")
    print("\nStatements per run by class (pg_stat_statements), the profile behind the figures:")
    for p in results:
        classes = p.extra.get("statements_by_class_per_run")
        if classes:
            span = statistics.mean(p.cleanup_seconds) if p.cleanup_seconds else 0
            top = ", ".join(f"{k} {v:,}" for k, v in list(classes.items())[:7])
            rate = f"{p.statements / span:,.0f}/s" if span and p.statements else "-"
            print(f"  {p.label}: {p.statements:,} ({rate}): {top}")
    lines = per_batch_lines(results)
    if lines:
        print(
            f"\nStatements per batch transaction (goal under a limit: <= {PER_BATCH_GOAL}x the unlimited run"
            " with as many workers):"
        )
        for line in lines:
            print(line)
    for p in results:
        if p.app.errors:
            print(f"{p.label}: pgbench reported {p.app.errors[:3]}")
    if base is None:
        return
    print("\nVerdict (goal: with a limit set, application p99 <= 1.2x idle and the sweep done before the next slot):")
    for p in results:
        if p.limits is None or not p.cleanup_seconds:
            continue
        g, portfolio_rate = p.limits
        ratio = p.app.p99_ms / base
        per_row_tx = p.transactions / p.rows_deleted if p.rows_deleted else 0
        per_row_big = p.transactions_big / p.rows_deleted if p.rows_deleted else 0
        # The limit binds: the sweep takes at least transactions / global rate, and the
        # big portfolio's transactions / the per-portfolio rate (they need its tokens).
        projected = max(per_row_tx * ONE_MILLION_ELIGIBLE / g, per_row_big * ONE_MILLION_ELIGIBLE / portfolio_rate)
        measured = statistics.mean(p.cleanup_seconds)
        fits = projected < slot_hours * 3600
        print(
            f"  {p.label}: p99 {p.app.p99_ms:.1f} ms = {ratio:.2f}x idle ({'met' if ratio <= P99_GOAL else 'MISSED'});"
            f" sweep {measured:.1f} s here ({p.transactions // max(p.runs, 1)} transactions,"
            f" {p.transactions_big // max(p.runs, 1)} of them the big portfolio's), projected at 1M"
            f" {projected / 60:.1f} min against a {slot_hours:g} h slot ({'fits' if fits else 'DOES NOT FIT'})"
        )
