#!/usr/bin/env bash
# Runs bench/pipeline.py against the committed HEAD (plus the working tree's
# bench/ and harness/ directories, the benchmark's own code) instead of the
# working tree, so a half-finished edit elsewhere in the tree cannot break or
# skew a measurement. Arguments go to pipeline.py.
#
#   bash bench/run-at-head.sh --rows 100000
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
snap=$(mktemp -d /tmp/bench-head.XXXXXX)
chmod 755 "$snap" # readable by postgres (the cluster's user when we are root), like a checkout
trap 'rm -rf "$snap"' EXIT
git -C "$repo" archive HEAD | tar -x -C "$snap"
rm -rf "$snap/bench" "$snap/harness"
tar -C "$repo" --exclude=__pycache__ --exclude=bench/out -cf - bench harness | tar -x -C "$snap"
git -C "$repo" rev-parse --short HEAD >"$snap/bench/.commit"

# Run in the background and forward INT/TERM/HUP as TERM, so pipeline.py
# always gets to stop its qcluster and PostgreSQL before the snapshot goes.
"$repo/.venv/bin/python" "$snap/bench/pipeline.py" "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null || true' INT TERM HUP
status=0
wait "$child" || status=$?
while kill -0 "$child" 2>/dev/null; do
    wait "$child" || status=$?
done
exit "$status"
