#!/usr/bin/env bash
# Measures an older commit and the committed HEAD in one session, round by round, on
# the same machine, and prints them side by side (bench/compare.py).
#
#   bash bench/side-by-side.sh 92d6f66 --rounds 2 -- --rows 1000000 --only loop,q1,q2,drain --nice -10
#
# The older commit runs with ITS OWN benchmark (bench/ and harness/ as committed
# there): today's benchmark imports modules (cleanup_ops.schedule,
# cleanup_ops.execution.runner, …) that older layouts do not have. HEAD runs with the
# working tree's bench/ and harness/, as bench/run-at-head.sh does. Both generate the
# same dataset from the same arguments (the generator is seeded); compare.py refuses
# a comparison whose rows deleted differ. Rounds alternate old, new, old, new, so
# both meet about the same load from the rest of the machine.
#
# Arguments before `--` are this script's (the commit, --rounds N); after it,
# pipeline.py's, given to both (use phases both versions know: loop,q1,q2,drain).
#
# --app-impact runs bench/app_impact.py instead (what the application feels) and
# prints each version's report, no comparison table. --same-bench gives the older
# commit the working tree's bench/ and harness/ too (when only product code differs
# between the two, as for a change of the limiter: both then print the same figures).
#
#   bash bench/side-by-side.sh main --app-impact --same-bench -- --only idle,q1,q2,q1lim,q2lim --limits 20:10,5:3
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
base=${1:?usage: side-by-side.sh COMMIT [--rounds N] -- PIPELINE ARGS}
shift
rounds=1
script=pipeline.py
same_bench=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case "$1" in
    --rounds)
        rounds=$2
        shift 2
        ;;
    --app-impact)
        script=app_impact.py
        shift
        ;;
    --same-bench)
        same_bench=1
        shift
        ;;
    *)
        echo "side-by-side.sh: unknown option $1" >&2
        exit 2
        ;;
    esac
done
[ "${1:-}" = "--" ] && shift

work=$(mktemp -d /tmp/bench-sbs.XXXXXX)
chmod 755 "$work" # readable by postgres (the cluster's user when we are root)
child=""
trap 'kill -TERM "$child" 2>/dev/null || true' INT TERM HUP
trap 'rm -rf "$work"' EXIT
base_short=$(git -C "$repo" rev-parse --short "$base")
head_short=$(git -C "$repo" rev-parse --short HEAD)
mkdir -p "$work/base" "$work/head" "$work/out"
chmod 755 "$work/base" "$work/head"
git -C "$repo" archive "$base" | tar -x -C "$work/base"
git -C "$repo" archive HEAD | tar -x -C "$work/head"
for tree in head ${same_bench:+base}; do
    rm -rf "$work/$tree/bench" "$work/$tree/harness"
    tar -C "$repo" --exclude=__pycache__ --exclude=bench/out -cf - bench harness | tar -x -C "$work/$tree"
done
echo "$base_short" >"$work/base/bench/.commit"
echo "$head_short" >"$work/head/bench/.commit"

run() { # tree round
    local tree=$1 round=$2
    shift 2
    echo "== round $round: $tree ($( [ "$tree" = base ] && echo "$base_short" || echo "$head_short"))" >&2
    "$repo/.venv/bin/python" "$work/$tree/bench/$script" "$@" >"$work/out/$tree-$round.txt" &
    child=$!
    wait "$child"
    child=""
}
for round in $(seq "$rounds"); do
    run base "$round" "${@}"
    run head "$round" "${@}"
done
# Each version's whole report, then the comparison. (A `| head` here would end the
# script through SIGPIPE under pipefail before the comparison is printed.)
for f in "$work"/out/*.txt; do
    echo "--- $(basename "$f")"
    sed -n '/^===/,$p' "$f"
done
[ "$script" = app_impact.py ] && exit 0 # its reports are the comparison
"$repo/.venv/bin/python" "$repo/bench/compare.py" \
    --label "$base_short" "$work"/out/base-*.txt --label "$head_short" "$work"/out/head-*.txt
