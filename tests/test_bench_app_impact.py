"""The arithmetic of bench/app_impact.py (bench/app_workload.py, bench/app_report.py) and
bench/compare.py: pgbench's per-transaction log parsed, transactions counted only inside
a run's window, nearest-rank percentiles, and the throughput tables of old and new
pipeline.py output read alike. No timing."""

from __future__ import annotations

from pathlib import Path

from bench.app_report import percentile, stats_from
from bench.app_workload import SCRIPTS, AppLoad, AppScope
from bench.compare import parse


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 99) != percentile([], 99)  # NaN: nothing measured


def test_stats_count_only_transactions_inside_the_windows() -> None:
    # (end epoch, latency ms, lag ms, script index)
    rows = [(10.5, 1.0, 0.0, 0), (11.0, 2.0, 0.1, 1), (20.0, 50.0, 0.0, 2), (30.5, 3.0, 0.0, 3)]
    stats = stats_from(rows, [(10.0, 12.0), (30.0, 31.0)], [])
    assert stats.transactions == 3
    assert stats.seconds == 3.0
    assert stats.tps == 1.0
    assert stats.p99_ms == 3.0  # the 50 ms transaction ended outside both windows
    assert set(stats.p99_by_script_ms) == set(SCRIPTS)


def test_pgbench_log_lines_are_parsed(tmp_path: Path) -> None:
    scope = AppScope(1, 10, 1, 5, 6, 9, quiet_portfolios=1, big_portfolio=1)
    load = AppLoad("postgresql://x@127.0.0.1:1/app", scope, rate=100, clients=2, work=tmp_path)
    prefix = tmp_path / "chunk0001"
    load.prefixes.append(prefix)
    # client_id transaction_no time(us) script_no time_epoch time_us schedule_lag(us)
    (tmp_path / "chunk0001.123").write_text("0 1 2500 0 1700000000 500000 100\n1 1 4000 3 1700000001 0 0\n")
    (tmp_path / "chunk0001.123.1").write_text("2 7 skipped 1 1700000002 0 0\n")  # -L skips are not latencies
    rows = sorted(load.transactions())
    assert rows == [(1700000000.5, 2.5, 0.1, 0), (1700000001.0, 4.0, 0.0, 3)]
    argv = load._argv(prefix)
    assert "-R" in argv and argv[-1].startswith("postgresql://")
    assert sum(a == "-f" for a in argv) == len(SCRIPTS)


def test_compare_reads_old_and_new_tables() -> None:
    old = (
        "run                                    rows deleted  seconds    rows/s  vs loop  admit s  check\n"
        "DELETE loop (1 process)                      95,016     1.35    70,609    1.00x        -     ok\n"
        "pipeline: qcluster, 1 worker                 95,016    10.61     8,954    0.13x    0.192     ok\n"
    )
    new = (
        "DELETE loop (1 process)                      95,016     1.40    70,609    1.00x        -   1.0   0.5"
        "    100     ok      0.01\n"
    )
    assert parse(old) == {
        "DELETE loop (1 process)": (95016, 1.35, 1.0),
        "pipeline: qcluster, 1 worker": (95016, 10.61, 0.13),
    }
    assert parse(new) == {"DELETE loop (1 process)": (95016, 1.4, 1.0)}


def test_statements_per_batch_compare_a_limited_run_with_the_unlimited_one_of_as_many_workers() -> None:
    from bench.app_report import Phase, per_batch_lines, statements_per_batch

    empty = stats_from([], [], [])
    free = Phase("q2", "q2, no limit", empty, runs=2, statements=2400, transactions=400)
    free.extra["statements_by_class_per_run"] = {"transaction control": 600, "rate tokens": 0}
    limited = Phase("q2lim-5-3", "q2, limit 5/s", empty, runs=1, statements=3400, transactions=200, limits=(5, 3))
    limited.extra["statements_by_class_per_run"] = {"transaction control": 700, "rate tokens": 210}
    loop = Phase("loop", "DELETE loop", empty, runs=1, statements=397)  # no batch transactions counted
    assert statements_per_batch(free) == 12.0  # 2,400 a run over 200 batches a run
    assert statements_per_batch(limited, "rate tokens") == 1.05
    lines = per_batch_lines([loop, free, limited])
    assert len(lines) == 2
    assert "12.0 per batch" in lines[0] and "x the unlimited" not in lines[0]
    assert "17.0 per batch (rate tokens 1.05, BEGIN/COMMIT 3.5)" in lines[1]
    assert "1.42x the unlimited run (met)" in lines[1]
