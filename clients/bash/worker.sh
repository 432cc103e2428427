#!/usr/bin/env bash
# A skiplock worker in bash + psql: runs a handler command once per task.
#
#   DATABASE_URL=postgresql://... STAGE=default ./worker.sh ./my-handler [ARGS...]
#
# The handler gets the task's payload (JSON) on stdin and TASK_ID, TASK_ATTEMPT, TASK_STAGE in
# its environment. Exit 0: the task is done (queue.finish). Exit 100: it failed for good
# (queue.fail fatal). Exit 101: not now (a rate limit, a resource not ready): the task goes back,
# due SNOOZE seconds later, its attempt not counted (queue.release with retry_in). Any other
# exit: the attempt failed and is retried after the stage's backoff; the handler's stderr (its
# last 2,000 bytes) becomes the task's error text.
#
# A background subshell heartbeats the tasks of the batch every LEASE/3 seconds while they run.
# Wake-ups: psql only reports a NOTIFY after it runs a command, so a script cannot block on
# LISTEN. The worker keeps one psql coprocess that LISTENs on "skiplock.<stage>", and when the
# stage is empty it sends that session `SELECT 1;` every PING seconds (a round trip that touches
# no table) and reads the answer with `read -t`: a notification shows up within PING seconds of
# the enqueue's commit. Every IDLE_WAIT seconds it takes anyway (the slow poll), so a lost
# notification or a dead listener never strands a task.
# SIGTERM or Ctrl-C: finish the batch in hand, then exit 0.
#
# Settings (environment): DATABASE_URL, STAGE (default), BATCH (10), LEASE seconds (60),
# IDLE_WAIT seconds (5), SNOOZE seconds (10), PING seconds (0.1), PSQL (psql; on Debian /usr/bin/psql is a Perl
# wrapper: /usr/lib/postgresql/<version>/bin/psql starts faster).
# SQL values always travel as psql variables (-v name=value, used as :'name'), never pasted into
# SQL text; psql does not expand variables in -c, so the SQL goes on stdin.

set -uo pipefail

: "${DATABASE_URL:?set DATABASE_URL}"
(( $# > 0 )) || { echo "usage: $0 HANDLER [ARGS...]" >&2; exit 2; }
HANDLER=("$@")
STAGE=${STAGE:-default}
BATCH=${BATCH:-10}
LEASE=${LEASE:-60}
IDLE_WAIT=${IDLE_WAIT:-5}
PING=${PING:-0.1}
PSQL=${PSQL:-psql}
FATAL_EXIT=100
SNOOZE_EXIT=101
SNOOZE=${SNOOZE:-10}
WORKER_NAME="$(hostname):$$"
BEAT=$(awk -v l="$LEASE" 'BEGIN { print l / 3 }')
IDLE_WAIT_US=$(awk -v w="$IDLE_WAIT" 'BEGIN { printf "%d", w * 1000000 }')
WORKDIR=$(mktemp -d)

stopping=false
trap 'stopping=true' TERM INT
trap 'stop_listener; rm -rf "$WORKDIR"' EXIT

sql() {  # SQL on stdin, values as -v arguments; prints unaligned, tab-separated rows
    "$PSQL" -X -q -At -F $'\t' -v ON_ERROR_STOP=1 -v VERBOSITY=sqlstate -d "$DATABASE_URL" "$@"
}

take() {  # one line per task: id, lease, attempt, payload (last: jsonb text has no tab or newline)
    sql -v stage="$STAGE" -v batch="$BATCH" -v lease_for="$LEASE seconds" -v worker="$WORKER_NAME" <<'SQL'
SELECT id, lease, attempt, payload
  FROM queue.take_next(stage => :'stage', batch => :'batch'::integer,
                       lease_for => :'lease_for'::interval, worker => :'worker')
SQL
}

finish() {  # id lease; prints t, or f when the lease was no longer ours
    sql -v id="$1" -v lease="$2" <<'SQL'
SELECT queue.finish(id => :'id'::bigint, lease => :'lease'::uuid)
SQL
}

release() {  # id lease seconds; prints t, or f when the lease was no longer ours
    sql -v id="$1" -v lease="$2" -v retry_in="$3 seconds" <<'SQL'
SELECT queue.release(id => :'id'::bigint, lease => :'lease'::uuid, retry_in => :'retry_in'::interval)
SQL
}

fail() {  # id lease error fatal; prints t, or f when the lease was no longer ours
    sql -v id="$1" -v lease="$2" -v error="$3" -v fatal="$4" <<'SQL'
SELECT queue.fail(id => :'id'::bigint, lease => :'lease'::uuid, error => :'error', fatal => :'fatal'::boolean)
SQL
}

heartbeat_batch() {  # the batch's lines; renews, in one psql session, each task still in hand
    # Values go in as -v id1=… -v lease1=…; the script only names them. After each call psql sets
    # SQLSTATE (00000, or SK001 when the lease is lost), which \echo reports with the id.
    local args=() script='' n=0 id lease rc state
    while IFS=$'\t' read -r id lease _; do
        [[ -e $WORKDIR/ended.$id || -e $WORKDIR/lost.$id ]] && continue
        n=$((n + 1))
        args+=(-v "id$n=$id" -v "lease$n=$lease")
        script+="SELECT queue.heartbeat(id => :'id$n'::bigint, lease => :'lease$n'::uuid,"
        script+=" lease_for => :'lease_for'::interval) AS expires \\gset"$'\n'
        script+="\\echo :id$n :SQLSTATE"$'\n'
    done <<< "$1"
    (( n > 0 )) || return 0
    "$PSQL" -X -q -At -v VERBOSITY=sqlstate -v lease_for="$LEASE seconds" -d "$DATABASE_URL" "${args[@]}" \
         <<< "$script" 2> "$WORKDIR/heartbeat.err" |
    while read -r id state; do
        case $state in
            00000) ;;
            SK001) : > "$WORKDIR/lost.$id" ;;   # someone else owns the task now
            *) echo "heartbeat on $id: SQLSTATE $state" >&2 ;;
        esac
    done
    rc=${PIPESTATUS[0]}
    (( rc == 0 || rc == 1 )) || cat "$WORKDIR/heartbeat.err" >&2   # 2: no connection; try again
}

beat_batch() {  # the batch's lines; runs in the background until killed
    # Every task of the batch is leased from the take, so all of them are renewed, not only the
    # one running: a task waiting behind a long one must not be reaped before it starts.
    local sleeper
    trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
    while :; do
        sleep "$BEAT" & sleeper=$!
        wait "$sleeper"
        heartbeat_batch "$1"
    done
}

run_task() {  # id lease attempt payload
    local id=$1 lease=$2 attempt=$3 payload=$4
    local errfile="$WORKDIR/stderr" rc ok error
    if [[ -e $WORKDIR/lost.$id ]]; then
        echo "lease lost on $id before it started: skipping it" >&2
        return
    fi
    TASK_ID=$id TASK_ATTEMPT=$attempt TASK_STAGE=$STAGE "${HANDLER[@]}" <<< "$payload" 2> "$errfile"
    rc=$?
    : > "$WORKDIR/ended.$id"
    cat "$errfile" >&2
    if [[ -e $WORKDIR/lost.$id ]]; then
        echo "lease lost on $id: dropping the result" >&2
        return
    fi
    if (( rc == 0 )); then
        ok=$(finish "$id" "$lease")
    elif (( rc == SNOOZE_EXIT )); then
        ok=$(release "$id" "$lease" "$SNOOZE")
        echo "snoozed $id for $SNOOZE s" >&2
    else
        error=$(tail -c 2000 "$errfile")
        [[ -n $error ]] || error="handler exited with status $rc"
        ok=$(fail "$id" "$lease" "$error" "$([[ $rc == "$FATAL_EXIT" ]] && echo true || echo false)")
    fi
    [[ $ok == t ]] || echo "lease lost on $id (or the call failed)" >&2
}

start_listener() {
    coproc LISTENER { exec "$PSQL" -X -q -At -v channel="skiplock.$STAGE" -d "$DATABASE_URL" 2>&1; }
    echo 'LISTEN :"channel";' >&"${LISTENER[1]}"
}

stop_listener() {
    [[ -n ${LISTENER_PID:-} ]] || return 0
    kill "$LISTENER_PID" 2>/dev/null
    wait "$LISTENER_PID" 2>/dev/null
    unset LISTENER_PID
}

wait_for_work() {  # returns when notified, after IDLE_WAIT seconds, or on SIGTERM
    local line rc deadline=$(( ${EPOCHREALTIME/./} + IDLE_WAIT_US ))
    if [[ -z ${LISTENER_PID:-} ]]; then
        start_listener            # it died: restart it, and take again before sleeping
        return 0
    fi
    while ! $stopping && (( ${EPOCHREALTIME/./} < deadline )); do
        echo 'SELECT 1;' >&"${LISTENER[1]}" 2>/dev/null || break
        # The answer ("1"), then any notification, come at once; then nothing until the next ping.
        while :; do
            read -r -t "$PING" -u "${LISTENER[0]}" line
            rc=$?
            (( rc == 0 )) || break
            [[ $line == 'Asynchronous notification'* ]] && return 0
            [[ $line == 1 ]] || echo "listener: $line" >&2
        done
        (( rc > 128 )) || break   # not a timeout (nor a signal): EOF, the listener died
    done
    if ! $stopping && (( ${EPOCHREALTIME/./} < deadline )); then
        echo "the listener died; restarting it in 1 s" >&2
        stop_listener
        sleep 1
    fi
}

drain_listener() {  # after a batch: have psql read its socket, so notifications cannot pile up
    # psql reads the server only while it runs a command; left alone during long work, a busy
    # stage's notifications would fill the socket and stall the server's notification queue.
    local line
    [[ -n ${LISTENER_PID:-} ]] || return 0
    echo 'SELECT 1; SELECT 2;' >&"${LISTENER[1]}" 2>/dev/null || return 0
    while read -r -t 5 -u "${LISTENER[0]}" line && [[ $line != 2 ]]; do :; done
}

start_listener                    # LISTEN before the first take: no enqueue slips between
while ! $stopping; do
    if ! batch=$(take); then
        echo "take_next failed; retrying in 1 s" >&2
        sleep 1
        continue
    fi
    if [[ -z $batch ]]; then
        wait_for_work
        continue
    fi
    beat_batch "$batch" &
    beater=$!
    while IFS=$'\t' read -r id lease attempt payload; do
        run_task "$id" "$lease" "$attempt" "$payload" < /dev/null
    done <<< "$batch"
    kill "$beater" 2>/dev/null
    wait "$beater" 2>/dev/null
    rm -f "$WORKDIR"/ended.* "$WORKDIR"/lost.*
    drain_listener                # we take again at once: what it said is stale
done
exit 0
