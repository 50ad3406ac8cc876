#!/usr/bin/env bash
# Runs a command with the demo document store up on a free loopback port, and
# stops the store when the command ends (or fails). The command sees DEBUG=true
# and DOCSTORE_URL (plus the demo's purge rate limits). The store's file is
# var/docstore.sqlite3, started fresh; its log is var/docstore.log.
#
#   bash scripts/with-docstore.sh [--report] .venv/bin/python manage.py cleanup_drain
#
# --report: when the command succeeds, print the store's request log (method,
# status, count).
set -euo pipefail
py=${PYTHON:-.venv/bin/python}
report=false
if [ "${1:-}" = "--report" ]; then
    report=true
    shift
fi
rm -f var/docstore.sqlite3 var/docstore.sqlite3-wal var/docstore.sqlite3-shm var/docstore.log
"$py" -m docstore --port 0 --db var/docstore.sqlite3 --rate 400 --burst 100 >var/docstore.log 2>&1 &
store=$!
trap 'kill $store 2>/dev/null; wait $store 2>/dev/null || true' EXIT
for _ in $(seq 50); do grep -q listening var/docstore.log 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/^docstore listening on //p' var/docstore.log)
[ -n "$url" ] || { echo "the document store did not start; see var/docstore.log" >&2; exit 1; }
echo "Document store: $url (var/docstore.sqlite3)"
export DEBUG=true DOCSTORE_URL=$url DOCSTORE_RATE_GLOBAL=200 DOCSTORE_BURST_GLOBAL=50
"$@"
if $report; then
    "$py" - <<'PY'
import sqlite3

rows = sqlite3.connect("var/docstore.sqlite3").execute(
    "select method, status, count(*) from requests group by 1, 2 order by 1, 2"
).fetchall()
print("Document store request log:", ", ".join(f"{m} {s}: {n}" for m, s, n in rows))
PY
fi
