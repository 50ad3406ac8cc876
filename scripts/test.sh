#!/usr/bin/env bash
# Runs the test suite: against $DATABASE_URL when set; otherwise against a
# throwaway PostgreSQL cluster when the server binaries are installed;
# otherwise against SQLite (PostgreSQL-only tests are then reported skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python

if [ -n "${DATABASE_URL:-}" ]; then
    echo "test.sh: using DATABASE_URL from the environment"
    exec "$PY" -m pytest "$@"
fi

pg_bin=""
if command -v initdb >/dev/null 2>&1; then
    pg_bin=$(dirname "$(command -v initdb)")
else
    for dir in /usr/lib/postgresql/*/bin; do
        [ -x "$dir/initdb" ] && pg_bin=$dir
    done
fi

if [ -z "$pg_bin" ]; then
    echo "test.sh: no PostgreSQL server found (initdb); running on SQLite, PostgreSQL-only tests will be skipped"
    exec "$PY" -m pytest -rs "$@"
fi

source scripts/pg-cluster.sh
pg_cluster_start "$pg_bin"
trap pg_cluster_stop EXIT
echo "test.sh: throwaway PostgreSQL at $DATABASE_URL"
"$PY" -m pytest -rs "$@"
