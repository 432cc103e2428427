#!/usr/bin/env bash
# An example handler for worker.sh: the payload is on stdin, TASK_ID, TASK_ATTEMPT and
# TASK_STAGE in the environment. Exit 0 = done, 100 = failed for good, 101 = not now (snoozed
# for the worker's SNOOZE seconds, the attempt not counted), anything else = retry later; what it
# writes to stderr becomes the error text.
# It understands a few demo fields: {"sleep": s} works for s seconds, {"fail_attempts": n}
# fails attempts 1..n, {"fatal": true} fails for good, {"snooze_until": t} snoozes until the
# Unix time t. The payload arrives as PostgreSQL prints jsonb ("key": value), so plain pattern
# matching does here; a real handler would use jq.
set -euo pipefail
payload=$(cat)
if [[ $payload =~ \"snooze_until\":\ ([0-9.]+) ]] &&
   awk -v t="${BASH_REMATCH[1]}" -v now="$EPOCHREALTIME" 'BEGIN { exit !(now < t) }'; then
    exit 101
fi
if [[ $payload =~ \"sleep\":\ ([0-9.]+) ]]; then
    sleep "${BASH_REMATCH[1]}"
fi
if [[ $payload == *'"fatal": true'* ]]; then
    echo "fatal by request" >&2
    exit 100
fi
if [[ $payload =~ \"fail_attempts\":\ ([0-9]+) ]] && (( TASK_ATTEMPT <= BASH_REMATCH[1] )); then
    echo "failing attempt $TASK_ATTEMPT by request" >&2
    exit 1
fi
echo "done $TASK_ID: $payload"
