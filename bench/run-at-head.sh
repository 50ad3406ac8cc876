#!/usr/bin/env bash
# Runs bench/pipeline.py (with --app-impact first: bench/app_impact.py) against
# the committed HEAD (plus the working tree's bench/ and harness/ directories, the
# benchmark's own code) instead of the working tree, so a half-finished edit
# elsewhere in the tree cannot break or skew a measurement. The other arguments
# go to the script.
#
#   bash bench/run-at-head.sh --rows 100000
#   bash bench/run-at-head.sh --app-impact --rows 200000   # bench/app_impact.py instead
set -euo pipefail
script=pipeline.py
if [ "${1:-}" = "--app-impact" ]; then
    script=app_impact.py
    shift
fi
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
"$repo/.venv/bin/python" "$snap/bench/$script" "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null || true' INT TERM HUP
status=0
wait "$child" || status=$?
while kill -0 "$child" 2>/dev/null; do
    wait "$child" || status=$?
done
exit "$status"
