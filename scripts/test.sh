#!/usr/bin/env bash
# Runs the test suite: against $DATABASE_URL when set; otherwise against a
# throwaway PostgreSQL cluster when the server binaries are installed;
# otherwise against SQLite (PostgreSQL-only tests are then reported skipped).
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

pg_bin=""
if [ -z "${DATABASE_URL:-}" ]; then
    if command -v initdb >/dev/null 2>&1; then
        pg_bin=$(dirname "$(command -v initdb)")
    else
        for dir in /usr/lib/postgresql/*/bin; do
            [ -x "$dir/initdb" ] && pg_bin=$dir
        done
    fi
fi

source scripts/pg-cluster.sh
pg_started=0
trap 'brokers_stop; [ "$pg_started" = 1 ] && pg_cluster_stop; true' EXIT
brokers_start

if [ -n "${DATABASE_URL:-}" ]; then
    echo "test.sh: using DATABASE_URL from the environment"
    "$PY" -m pytest "$@"
elif [ -z "$pg_bin" ]; then
    echo "test.sh: no PostgreSQL server found (initdb); running on SQLite, PostgreSQL-only tests will be skipped"
    "$PY" -m pytest -rs "$@"
else
    pg_started=1
    pg_cluster_start "$pg_bin"
    echo "test.sh: throwaway PostgreSQL at $DATABASE_URL"
    "$PY" -m pytest -rs "$@"
fi
