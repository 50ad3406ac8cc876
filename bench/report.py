"""The benchmark's output: the throughput table, per-run details, the profile table, peak
RSS, admission and target lines, and ``docs/benchmarks.md`` (``--write-docs``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.dataset import BIG_PROPERTIES, SMALL_PORTFOLIOS, Dataset
from bench.runs import RunResult


def print_header(ds: Dataset, *, batch: int, properties: int, code: str) -> None:
    print(f"\n=== bench/pipeline.py: {ds.total:,} leases, batch size {batch}; code: {code} ===")
    print(
        f"eligible {ds.eligible:,}; held past cutoff {ds.held:,} ({100 * ds.held / ds.total:.2f}%);"
        f" {ds.holds} legal holds; {properties} properties / {1 + SMALL_PORTFOLIOS} portfolios"
        f" (one portfolio holds half the rows over {BIG_PROPERTIES} properties);"
        f" generated in {ds.generate_seconds:.1f} s"
    )


def print_runs(title: str, runs: list[RunResult]) -> None:
    loop = next((r for r in runs if r.label.startswith("DELETE loop")), None)
    print(f"\n{title}")
    head = (
        f"{'run':<38} {'rows deleted':>12} {'seconds':>8} {'rows/s':>9} {'vs loop':>8} {'admit s':>8} {'check':>6}"
        f" {'other cpu':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in runs:
        ratio = f"{loop.seconds / r.seconds:.2f}x" if loop else "-"
        admit = f"{r.admission_seconds:.3f}" if r.admission_seconds is not None else "-"
        rate = r.deleted / r.seconds if r.seconds else 0
        other = r.extra.get("other_cpu_cores")
        print(
            f"{r.label:<38} {r.deleted:>12,} {r.seconds:>8.2f} {rate:>9,.0f} {ratio:>8} {admit:>8}"
            f" {'ok' if r.ok else 'FAIL':>6} {'-' if other is None else f'{other:.2f}':>9}"
        )
    print(
        "(vs loop: loop seconds / run seconds; admit s: sweep creation + admission, inside 'seconds';"
        " other cpu: cores that processes outside this benchmark used meanwhile, of 2)"
    )


def write_docs(path: Path, *, rows: int, batch: int, runs: list[RunResult], code: str) -> None:
    """docs/benchmarks.md: the throughput table, a bar chart, fairness and pickup figures."""
    loop = next((r for r in runs if r.label.startswith("DELETE loop")), None)
    ceiling = next((r for r in runs if r.label.startswith("one DELETE")), None)
    fastest = max((r.deleted / r.seconds for r in runs if r.seconds), default=1)
    lines = [
        f"## {rows:,} leases, batch size {batch} (code {code})",
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
    existing = path.read_text() if path.exists() else "# Benchmarks\n\nWritten by `bench/pipeline.py --write-docs`.\n"
    marker = f"## {rows:,} leases"
    kept = [part for part in existing.split("\n## ") if not ("## " + part).startswith(marker)]
    text = "\n## ".join(kept).rstrip() + "\n\n" + body
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
        "all_seconds",
        "all_handoff_seconds",
        "all_other_cpu_cores",
    ]
    for r in runs:
        shown = {k: r.extra[k] for k in keys if k in r.extra}
        print(f"  {r.label}: " + ", ".join(f"{k}={v}" for k, v in shown.items()))


def print_profile(prof_run: RunResult, loops: list[RunResult]) -> None:
    profile: dict[str, list[float]] = prof_run.extra.get("profile", {})
    if not profile:
        return
    batch_keys = [k for k in profile if k.startswith("fn: run_batch")]
    batches = int(sum(profile[k][0] for k in batch_keys))
    slices = int(profile.get("fn: job_run_slice", [0, 0])[0])
    print(f"\nProfile of cleanup_drain ({batches} run_batch calls, {slices} slices; ms per call and total s):")
    print(f"  {'what':<82} {'calls':>7} {'ms/call':>8} {'total s':>8}")
    for key, (calls, total) in sorted(profile.items(), key=lambda kv: -kv[1][1]):
        print(f"  {key:<82} {int(calls):>7} {1000 * total / max(calls, 1):>8.3f} {total:>8.2f}")
    if batches:
        batch_total = sum(profile[k][1] for k in batch_keys)
        sql_in_batch = sum(v[1] for k, v in profile.items() if k.startswith("sql[run_batch]"))
        stmts = sum(v[0] for k, v in profile.items() if k.startswith("sql[run_batch]"))
        print(
            f"  run_batch: {1000 * batch_total / batches:.2f} ms/batch, {stmts / batches:.2f} statements/batch,"
            f" {1000 * sql_in_batch / batches:.2f} ms in execute(), "
            f"{1000 * (batch_total - sql_in_batch) / batches:.2f} ms other (COMMIT, Python)"
        )
    for run in loops:
        if run.extra.get("batches"):
            print(f"  {run.label}: {1000 * run.seconds / run.extra['batches']:.2f} ms/batch (autocommit)")


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
    verdict = "met" if admission["admission_seconds"] < 5 else "MISSED"
    print(
        f"\nAdmission of {admission['partitions']:,} partitions: {admission['admission_seconds']:.2f} s"
        f" (target < 5 s: {verdict}); of which partitions_due {admission['partitions_due_seconds']:.2f} s;"
        f" dispatch after commit {admission['dispatch_seconds']:.3f} s;"
        f" one dispatcher call with {admission['partitions']:,} open jobs"
        f" {1000 * admission['dispatch_10k_open_seconds']:.1f} ms"
    )


def print_target(runs: list[RunResult]) -> None:
    """The brief's target: the default-window 1-worker pipeline at >= 0.8x the DELETE loop."""
    loop = next((r for r in runs if r.label.startswith("DELETE loop")), None)
    q1 = next((r for r in runs if r.label == "pipeline: qcluster, 1 worker"), None)
    if loop and q1:
        ratio = loop.seconds / q1.seconds
        print(f"\nTarget pipeline (1 worker) >= 0.8x loop: {ratio:.2f}x -> {'met' if ratio >= 0.8 else 'MISSED'}")
