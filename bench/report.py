"""The benchmark's output: the throughput table, statements per partition by class, per-run
details, peak RSS, pickup and idle figures, admission and target lines, a JSON dump
(``--save``) and ``docs/benchmarks.md`` (``--write-docs``, backlog shape)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.dataset import BIG_PROPERTIES, Dataset, Scope
from bench.runs import RunResult
from bench.statements import CLASSES, sent


def print_header(ds: Dataset, *, batch: int, scope: Scope, code: str) -> None:
    what = "leases" if ds.shape == "backlog" else f"rows of {len(ds.kinds)} record kinds ({ds.shape} shape)"
    print(f"\n=== bench/pipeline.py: {ds.total:,} {what}, batch size {batch}; code: {code} ===")
    layout = (
        f"one portfolio holds half the rows over {BIG_PROPERTIES} properties"
        if ds.shape == "backlog"
        else "rows spread evenly; document_id NULL, so no purge jobs"
    )
    print(
        f"eligible {ds.eligible:,}; held past cutoff {ds.held:,} ({100 * ds.held / ds.total:.2f}%);"
        f" {ds.holds} legal holds; {len(scope.properties)} properties / {scope.portfolios} portfolios"
        f" ({layout}); generated in {ds.generate_seconds:.1f} s"
    )
    if len(ds.kinds) > 1:
        print("per kind: " + ds.describe())


def print_runs(title: str, runs: list[RunResult]) -> None:
    loop = next((r for r in runs if r.label.startswith("DELETE loop")), None)
    print(f"\n{title}")
    head = (
        f"{'run':<38} {'rows deleted':>12} {'seconds':>8} {'rows/s':>9} {'vs loop':>8} {'admit s':>8} {'CPU s':>6}"
        f" {'(DB)':>6} {'stmts':>6} {'check':>6} {'other cpu':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in runs:
        ratio = f"{loop.seconds / r.seconds:.2f}x" if loop else "-"
        admit = f"{r.admission_seconds:.3f}" if r.admission_seconds is not None else "-"
        rate = r.deleted / r.seconds if r.seconds else 0
        other = r.extra.get("other_cpu_cores")
        cpu = r.extra.get("cpu_seconds")
        cpu_db = r.extra.get("cpu_db_seconds")
        server = r.extra.get("server")
        stmts = sent(server["by_class"])[0] if server else None
        print(
            f"{r.label:<38} {r.deleted:>12,} {r.seconds:>8.2f} {rate:>9,.0f} {ratio:>8} {admit:>8}"
            f" {'-' if cpu is None else f'{cpu:.2f}':>6} {'-' if cpu_db is None else f'{cpu_db:.2f}':>6}"
            f" {'-' if stmts is None else stmts:>6}"
            f" {'ok' if r.ok else 'FAIL':>6} {'-' if other is None else f'{other:.2f}':>9}"
        )
    print(
        "(vs loop: loop seconds / run seconds; admit s: sweep creation + admission, inside 'seconds';"
        " CPU s: CPU seconds of this benchmark's processes (workers, drain, loop) and its PostgreSQL during the run,"
        " (DB): PostgreSQL's part;"
        " stmts: statements PostgreSQL received, BEGIN/COMMIT and FK trigger lookups not counted;"
        " other cpu: cores that processes outside this benchmark used meanwhile, of 2)"
    )


# docs/benchmarks.md's Backlog section holds these two lines; --write-docs replaces what lies between them.
DOCS_BEGIN = "<!-- bench/pipeline.py --write-docs: begin -->"
DOCS_END = "<!-- bench/pipeline.py --write-docs: end -->"


def write_docs(path: Path, *, rows: int, batch: int, runs: list[RunResult], code: str) -> None:
    """docs/benchmarks.md, between the markers of its Backlog section (appended at the end when
    they are missing): the throughput table, a bar chart, fairness and pickup figures."""
    loop = next((r for r in runs if r.label.startswith("DELETE loop")), None)
    ceiling = next((r for r in runs if r.label.startswith("one DELETE")), None)
    fastest = max((r.deleted / r.seconds for r in runs if r.seconds), default=1)
    lines = [
        f"`bench/pipeline.py --write-docs`: {rows:,} leases, batch size {batch}, code {code}.",
        "",
        "| run | rows deleted | seconds | rows/s | vs loop | vs one DELETE | small portfolios done"
        " (p50 / p95 of drain) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    chart = []
    for r in runs:
        rate = r.deleted / r.seconds if r.seconds else 0
        vs_loop = f"{loop.seconds / r.seconds:.2f}x" if loop else "-"
        vs_one = f"{ceiling.seconds / r.seconds:.2f}x" if ceiling else "-"
        fair = r.extra.get("small_done_share_p50")
        fairness = f"{fair:.0%} / {r.extra['small_done_share_p95']:.0%}" if fair is not None else "-"
        lines.append(
            f"| {r.label} | {r.deleted:,} | {r.seconds:.2f} | {rate:,.0f} | {vs_loop} | {vs_one} | {fairness} |"
        )
        chart.append(f"{r.label[:36]:<36} {'#' * max(1, round(40 * rate / fastest))} {rate:,.0f} rows/s")
    waits = [
        f"- {r.label}: first lease {r.extra['first_lease_wait_s_p50']} s p50, {r.extra['first_lease_wait_s_p95']} s p95"
        for r in runs
        if "first_lease_wait_s_p50" in r.extra
    ]
    body = "\n".join([*lines, "", "```", *chart, "```", "", "Wait from admission to a job's first lease:", *waits, ""])
    block = f"{DOCS_BEGIN}\n\n{body}\n{DOCS_END}"
    existing = path.read_text() if path.exists() else "# Benchmarks\n"
    if DOCS_BEGIN in existing and DOCS_END in existing.split(DOCS_BEGIN, 1)[1]:
        head, rest = existing.split(DOCS_BEGIN, 1)
        text = head + block + rest.split(DOCS_END, 1)[1]
    else:
        text = existing.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)


def print_details(runs: list[RunResult]) -> None:
    print("\nPer run (jobs, slices = leases taken, batches = ledger rows; gaps from ledger timestamps):")
    keys = [
        "batches",
        "candidates_ms_per_batch",
        "delete_ms_per_batch",
        "jobs",
        "slices",
        "ledger_batches",
        "broker_tasks",
        "noop_tasks",
        "noop_tasks_duplicate_send",
        "dispatch_tasks",
        "batch_gap_ms_median",
        "slice_gap_ms_median",
        "slice_gaps",
        "slice_gap_seconds_total",
        "handoff_ms_median",
        "handoff_ms_p90",
        "handoff_seconds_total",
        "first_batch_after_trigger_ms",
        "dispatch_seconds",
        "worker_processes",
        "worker_peak_rss_mb",
        "maxrss_mb",
        "small_done_share_p50",
        "small_done_share_p95",
        "first_lease_wait_s_p50",
        "first_lease_wait_s_p95",
        "transactions",
        "job_leases_per_transaction",
        "releases_with_work_left",
        "handoffs_per_1000_transactions",
        "turns",
        "transactions_per_turn",
        "batches_span_s",
        "tx_gap_ms_median",
        "cpu_seconds",
        "cpu_db_seconds",
        "all_seconds",
        "all_cpu_seconds",
        "all_handoff_seconds",
        "all_other_cpu_cores",
        "round_ratios_vs_loop",
        "median_ratio_vs_loop",
        "median_cpu_ratio_vs_loop",
    ]
    for r in runs:
        shown = {k: r.extra[k] for k in keys if k in r.extra}
        print(f"  {r.label}: " + ", ".join(f"{k}={v}" for k, v in shown.items()))


def _admitted(r: RunResult) -> int:
    return int(r.extra.get("admitted") or r.extra.get("jobs") or 0)


def print_statements(runs: list[RunResult], *, method: str) -> None:
    """Per run: statements the server received (by class), per admitted partition."""
    shown = [r for r in runs if r.extra.get("server")]
    if not shown:
        return
    print(
        f"\nStatements received by PostgreSQL per run ({method}; the benchmark's polling excluded;"
        " BEGIN/COMMIT counted apart; FK lookups run by PostgreSQL's own triggers shown, not counted):"
    )
    head = (
        f"  {'run':<38} {'statements':>10} {'BEGIN/COMMIT':>12} {'FK lookups':>10} {'partitions':>10}"
        f" {'per partition':>13} {'incl. tx':>9} {'pages':>12} {'pages/row':>9}"
    )
    print(head)
    for r in shown:
        by_class = r.extra["server"]["by_class"]
        statements, tx, internal = sent(by_class)
        parts = _admitted(r)
        per = f"{statements / parts:.2f}" if parts else "-"
        per_tx = f"{(statements + tx) / parts:.2f}" if parts else "-"
        # Shared buffer pages the run's statements touched (hit or read): the
        # server's work as a count, which the machine's load does not move.
        pages = int(sum(v[3] for v in by_class.values() if len(v) > 3))
        per_row = f"{pages / r.deleted:.2f}" if r.deleted else "-"
        print(
            f"  {r.label:<38} {statements:>10,} {tx:>12,} {internal:>10,} {parts or '-':>10} {per:>13} {per_tx:>9}"
            f" {pages:>12,} {per_row:>9}"
        )
    pipeline = [r for r in shown if _admitted(r)]
    if not pipeline:
        return
    print("\n  per admitted partition, by class (server-side calls; ms = server execution time in total):")
    classes = [c for c in CLASSES if any(c in r.extra["server"]["by_class"] for r in pipeline)]
    head = f"  {'class':<22}" + "".join(f" {r.label.replace('pipeline: ', '')[:24]:>24}" for r in pipeline)
    print(head)
    for c in classes:
        cells = []
        for r in pipeline:
            v = r.extra["server"]["by_class"].get(c, [0, 0.0, 0.0])
            cells.append(f"{v[0] / _admitted(r):>8.3f} ({v[1]:>9.1f} ms)")
        print(f"  {c:<22}" + "".join(f" {cell:>24}" for cell in cells))


def print_counted(run: RunResult, loops: list[RunResult]) -> None:
    """The in-process count (execute wrapper): per class, statements per partition and
    client-side time; per-function timers; the costliest statements."""
    counted = run.extra.get("counted")
    if not counted:
        return
    parts = _admitted(run)
    calls, secs = counted["calls"], counted["seconds"]
    total = sum(calls.values())
    print(
        f"\nIn-process count of cleanup_drain (execute wrapper; {parts:,} partitions admitted,"
        f" {run.seconds:.2f} s with the wrappers; round-trip time as the client saw it):"
    )
    server = (run.extra.get("server") or {}).get("by_class", {})
    params = counted.get("params", {})
    print(
        f"  {'class':<22} {'statements':>10} {'per partition':>13} {'client s':>9} {'ms/stmt':>8}"
        f" {'server exec s':>13} {'plan s':>7} {'client - server s':>17} {'params/stmt':>11}"
    )
    for c in [c for c in CLASSES if c in calls] + sorted(set(calls) - set(CLASSES)):
        v = server.get(c, [0, 0.0, 0.0])
        print(
            f"  {c:<22} {calls[c]:>10,} {calls[c] / max(parts, 1):>13.3f} {secs[c]:>9.3f}"
            f" {1000 * secs[c] / max(calls[c], 1):>8.3f} {v[1] / 1000:>13.3f} {v[2] / 1000:>7.3f}"
            f" {secs[c] - (v[1] + v[2]) / 1000:>17.3f} {params.get(c, 0) / max(calls[c], 1):>11.1f}"
        )
    internal = {c: v for c, v in server.items() if c not in calls}
    for c, v in internal.items():
        print(
            f"  {c:<22} {int(v[0]):>10,} {v[0] / max(parts, 1):>13.3f} {'-':>9} {'-':>8}"
            f" {v[1] / 1000:>13.3f} {v[2] / 1000:>7.3f}"
        )
    print(
        f"  {'all':<22} {total:>10,} {total / max(parts, 1):>13.3f} {sum(secs.values()):>9.3f};"
        f" transactions committed {counted['commits']:,} ({counted['commits'] / max(parts, 1):.3f} per partition),"
        f" rolled back {counted['rollbacks']}; server exec {sum(v[1] for v in server.values()) / 1000:.3f} s,"
        f" plan {sum(v[2] for v in server.values()) / 1000:.3f} s"
    )
    timers = run.extra.get("timers", {})
    if timers:
        print("  per function (wall time, inclusive):")
        for name, (n, t) in sorted(timers.items(), key=lambda kv: -kv[1][1]):
            print(f"    {name:<40} {n:>7,} calls {1000 * t / max(n, 1):>8.3f} ms/call {t:>8.3f} s")
    print("  costliest statements (class, text, calls, client s):")
    for cls, text, n, t in counted["top"][:15]:
        print(f"    {cls:<20} {n:>6,} {t:>7.3f}  {text}")
    for loop in loops:
        if loop.extra.get("statements"):
            print(
                f"  {loop.label}: {loop.extra['statements']:,} statements, {loop.seconds:.3f} s"
                f" ({1000 * loop.seconds / loop.extra['statements']:.3f} ms/statement, autocommit)"
            )


def print_plans(plans: dict[str, Any] | None) -> None:
    if not plans:
        return
    print(
        f"\nOne group's statements in isolation ({plans['group']} partitions, rolled back, median; server ="
        f" EXPLAIN ANALYZE (planning ms, execution ms)); round trip SELECT 1: {plans['round_trip_ms']} ms"
    )
    c = plans.get("candidates")
    if isinstance(c, dict):
        print(
            f"  candidates ({c['partitions']} {c['kind']} partitions): keyset index (property, id): client"
            f" {c['keyset_client_ms']} ms, server {c['keyset_index']}; due index (property, timestamp, id):"
            f" client {c['due_client_ms']} ms, server {c['due_index']}; same result: {c['same_result']}"
        )
        for line in c.get("keyset_plan", []):
            print(f"      {line}")
    elif c:
        print(f"  candidates: {c}")
    d = plans.get("delete")
    if isinstance(d, dict):
        print(
            f"  group DELETE over {d['partitions']} partitions' candidate ranges: client {d['client_ms']} ms,"
            f" server {d['server']}"
        )
        for line in d.get("plan", []):
            print(f"      {line}")
    elif d:
        print(f"  group DELETE: {d}")
    li = plans.get("ledger_insert")
    if isinstance(li, dict):
        print(
            f"  ledger insert of {li['rows']} rows: VALUES with {li['scalar_params']} parameters: client"
            f" {li['scalar_client_ms']} ms, server {li['scalar_server_ms']}; 13 arrays through unnest: client"
            f" {li['arrays_client_ms']} ms, server {li['arrays_server_ms']}"
        )
    elif li:
        print(f"  ledger insert: {li}")
    ju = plans.get("job_update")
    if isinstance(ju, dict):
        print(
            f"  job update of {ju['rows']} rows ({ju['indexes']} indexes on the job table): the finishing UPDATE"
            f" (state changes): client {ju['finish_client_ms']} ms, server {ju['finish_server_ms']}; an UPDATE of"
            f" unindexed counters only: client {ju['hot_client_ms']} ms, server {ju['hot_server_ms']}"
        )
    elif ju:
        print(f"  job update: {ju}")


def print_latency(latency: dict[str, Any] | None) -> None:
    if not latency:
        return
    scenarios = [k for k in ("sweep", "retry", "redrive") if k in latency]
    if scenarios:
        print("\nPickup latency, warm idle qcluster with 2 workers (leased at - available_at, seconds):")
        print(f"  {'becomes due by':<16} {'samples':>7} {'timed out':>9} {'p50':>7} {'p95':>7} {'max':>7}")
        for k in scenarios:
            v = latency[k]
            print(
                f"  {k:<16} {v['samples']:>7} {v['timed_out']:>9} {v['p50'] if v['p50'] is not None else '-':>7}"
                f" {v['p95'] if v['p95'] is not None else '-':>7} {v['max'] if v['max'] is not None else '-':>7}"
            )
            print(f"    all: {v['all']}")
            if "due_to_task_start_p50" in v:
                print(
                    f"    due -> task started (qcluster log): p50 {v['due_to_task_start_p50']} s,"
                    f" max {v['due_to_task_start_max']} s; task started -> leased: p50"
                    f" {v['task_start_to_lease_p50']} s, max {v['task_start_to_lease_max']} s"
                )
    idle = latency.get("idle")
    if idle:
        print(
            f"\nIdle cluster (2 workers, nothing due, {idle['seconds']:.0f} s): {idle['statements_per_s']} statements/s"
            f" ({idle['method']}), {idle['xact_per_s']} transactions/s (pg_stat_database.xact_commit);"
            f" open jobs at the end: {idle.get('open_jobs')}"
        )
        for cls, text, n, ms, *_ in idle["top"][:12]:
            print(f"    {cls:<20} {n:>6,} calls {ms:>8.1f} ms  {text}")
    if "worker_peak_rss_mb" in latency:
        print(f"  worker peak RSS during pickup/idle: {latency['worker_peak_rss_mb']} MB")


def print_targets(
    runs: list[RunResult], admission: dict[str, Any] | None, latency: dict[str, Any] | None, *, shape: str
) -> None:
    """Issue 11's goals, met or missed, with the figure."""
    loop = next((r for r in runs if r.label.startswith("DELETE loop")), None)
    lines = []

    def ratio(label: str) -> float | None:
        r = next((r for r in runs if r.label == label), None)
        return loop.seconds / r.seconds if loop and r and r.seconds else None

    goals = (
        [("pipeline: cleanup_drain (1 process)", 0.5), ("pipeline: qcluster, 2 workers", 0.5)]
        if shape == "nightly"
        else [("pipeline: qcluster, 1 worker", 1.0), ("pipeline: qcluster, 2 workers", 1.8)]
    )
    for label, goal in goals:
        x = ratio(label)
        if x is not None:
            r = next(r for r in runs if r.label == label)
            extra = ""
            if "median_ratio_vs_loop" in r.extra:
                m = r.extra["median_ratio_vs_loop"]
                extra = f"; median of the rounds {m:.2f}x -> {'met' if m >= goal else 'MISSED'}"
                if "median_cpu_ratio_vs_loop" in r.extra:
                    extra += f"; CPU seconds, loop / run, median {r.extra['median_cpu_ratio_vs_loop']:.2f}x"
            lines.append(f"{label} >= {goal}x the loop: fastest {x:.2f}x -> {'met' if x >= goal else 'MISSED'}{extra}")
    if shape == "nightly":
        for r in runs:
            server = r.extra.get("server")
            if server and _admitted(r) and r.label.startswith(("pipeline", "cleanup_drain")):
                statements, tx, _ = sent(server["by_class"])
                per = statements / _admitted(r)
                lines.append(
                    f"{r.label}: <= 4 statements per admitted partition: {per:.2f}"
                    f" ({(statements + tx) / _admitted(r):.2f} with BEGIN/COMMIT)"
                    f" -> {'met' if per <= 4 else 'MISSED'}"
                )
    if admission:
        a = admission["admission_seconds"]
        goal = 2.0 if admission["partitions"] >= 30_000 else 5.0
        verdict = "met" if a < goal else "MISSED"
        lines.append(f"admission of {admission['partitions']:,} partitions < {goal:g} s: {a:.2f} s -> {verdict}")
    for k in ("sweep", "retry", "redrive"):
        v = (latency or {}).get(k)
        if v:
            p95 = v["p95"]
            ok = p95 is not None and p95 < 1.0 and not v["timed_out"]
            late = f" ({v['timed_out']} timed out)" if v["timed_out"] else ""
            lines.append(f"pickup p95 < 1 s ({k}): {p95} s{late} -> {'met' if ok else 'MISSED'}")
    if lines:
        print("\nTargets (issue 11):")
        for line in lines:
            print(f"  {line}")


def save_json(path: Path, **data: Any) -> None:
    ds = data.pop("ds")
    runs = data.pop("runs")
    out = {
        **data,
        "dataset": {
            "shape": ds.shape,
            "total": ds.total,
            "eligible": ds.eligible,
            "held": ds.held,
            "holds": ds.holds,
            "kinds": {k: vars(v) for k, v in ds.kinds.items()},
        },
        "runs": [
            {
                "label": r.label,
                "seconds": r.seconds,
                "deleted": r.deleted,
                "ok": r.ok,
                "admission": r.admission_seconds,
                "extra": r.extra,
            }
            for r in runs
        ],
    }
    path.write_text(json.dumps(out, indent=1, default=str))


def print_rss(rss_rows: list[tuple[int, str, float]]) -> None:
    """``rss_rows``: (dataset rows, run label, peak MB)."""
    if not rss_rows:
        return
    print("\nPeak RSS of a worker (qcluster: VmHWM of the worker processes; drain: ru_maxrss):")
    for rows, label, mb in sorted(rss_rows):
        print(f"  {rows:>10,} rows  {label:<38} {mb:>7.1f} MB")


def print_admission(admission: dict[str, Any] | None) -> None:
    if not admission:
        return
    due = admission.get("partitions_due_seconds")
    server = admission.get("server")
    statements = ""
    if server:
        n, tx, internal = sent(server["by_class"])
        statements = f"; {n} statements + {tx} BEGIN/COMMIT ({internal} FK lookups in triggers)"
    print(
        f"\nAdmission of {admission['partitions']:,} partitions ({admission['properties']:,} properties x"
        f" {admission['kinds']} kinds): {admission['admission_seconds']:.2f} s (sweep_trigger, dispatch excluded)"
        + (f"; of which partitions_due {due:.2f} s" if due is not None else "")
        + f"; dispatch after commit {admission['dispatch_seconds']:.3f} s{statements};"
        f" one dispatcher call with {admission['partitions']:,} open jobs"
        f" {1000 * admission['dispatch_open_seconds']:.1f} ms"
    )
