#!/usr/bin/env bash
# A cron job made a singleton with `fenced run`: however many hosts (or
# overlapping cron ticks) start it, one runs the job and the others skip
# this round. In a crontab:
#
#   */5 * * * * FENCED_BACKEND=redis://locks.internal:6379 fenced run -n nightly-report -- /usr/local/bin/report.sh
#
# `-n` does not wait: a tick that finds the job still running (or running
# on another host) exits 75 at once, which cron ignores. The job gets
# FENCED_TOKEN, its fencing token, to hand to what it writes. If the lock
# is lost while it runs (its host cut off past the lease), fenced kills the
# job and exits 76, before another host can start it.
#
# Run as is, this script shows it: two ticks start at once, one runs.
set -euo pipefail
fenced=${FENCED:-fenced}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export FENCED_BACKEND=${FENCED_BACKEND:-sqlite://$dir/locks.db}
job="sleep 2; echo ran >> $dir/runs"
pids=()
for tick in 1 2; do
  "$fenced" run -n nightly-report -- sh -c "$job" & pids+=($!)
done
codes=()
for p in "${pids[@]}"; do
  code=0; wait "$p" || code=$?
  codes+=("$code")
done
runs=$(wc -l < "$dir/runs")
echo "exit codes: ${codes[*]}; the job ran $runs time(s)"
# One tick ran the job (0), the other found it running (75).
[[ $runs -eq 1 ]] && [[ " ${codes[*]} " == *" 0 "* ]] && [[ " ${codes[*]} " == *" 75 "* ]]
