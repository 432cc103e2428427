#!/usr/bin/env bash
# A skiplock worker in bash + psql: runs a handler command once per task.
#
#   DATABASE_URL=postgresql://... STAGE=default ./worker.sh ./my-handler [ARGS...]
#
# STAGE may name several stages, comma-separated, and prefixes ('tenant.*'): they are taken in one
# call, round robin by the stages' weights (queue.take_next(stages[])), and each task is finished,
# failed, released and heartbeated with its own stage. The round robin goes on from the last
# take's turn (the setting skiplock.turn, carried from each psql session to the next). A single
# name is taken with queue.take_next(stage), which Citus runs too (it refuses the multi-stage one).
#
# The handler gets the task's payload (JSON) on stdin and TASK_ID, TASK_ATTEMPT, TASK_STAGE in
# its environment. Exit 0: the task is done (queue.finish). Exit 100: it failed for good
# (queue.fail fatal). Exit 101: not now (a rate limit, a resource not ready): the task goes back,
# due SNOOZE seconds later, its attempt not counted (queue.release with retry_in). Any other
# exit: the attempt failed and is retried after the stage's backoff; the handler's stderr (its
# last 2,000 bytes, less NUL bytes and what is not UTF-8) becomes the task's error text, or, should
# the server refuse that, "handler exited with status N; its stderr was refused".
#
# A background subshell heartbeats the tasks of the batch every LEASE/3 seconds while they run.
# Wake-ups: psql only reports a NOTIFY after it runs a command, so a script cannot block on
# LISTEN. The worker keeps one psql coprocess that LISTENs on "skiplock.<stage>" for each stage
# named, and when its stages are empty it sends that session `SELECT 1;` every PING seconds (a
# round trip that touches no table) and reads the answer with `read -t`: a notification on any of
# them shows up within PING seconds of the enqueue's commit. A prefix cannot be listened to (its
# stages have no channel in common): the stages it finds are taken at the slow poll, and with
# prefixes alone there is no listener. Every IDLE_WAIT seconds it takes anyway (the slow poll), so
# a lost notification or a dead listener never strands a task. When the listener's psql dies (its
# connection lost, the server restarted), the worker starts another one and carries on.
# SIGTERM or Ctrl-C: finish the batch in hand, then exit 0. The handler and every psql run in a
# session of their own (setsid), so a terminal's Ctrl-C, sent to the whole foreground process
# group, reaches the worker only and does not cut the running handler short.
# A finish, fail or release that fails (the server down for a moment, the connection lost) is
# retried, backing off up to 2 s, until the task's lease has surely run out (LEASE seconds after
# the handler ended: its heartbeats stop then); a call that answers false means the lease was lost.
#
# Through a connection pooler in transaction mode (PgBouncer pool_mode=transaction), set
# SKIPLOCK_POOLER=transaction: there is no listener then (its notifications would reach a server
# connection, not psql) and an idle worker takes again every IDLE_WAIT seconds. psql prepares
# nothing, so nothing else changes.
#
# Settings (environment): DATABASE_URL, STAGE (default; names and prefixes, comma-separated,
# blanks around each trimmed: a stage whose name holds a comma cannot be served), BATCH (10), LEASE
# seconds (60), IDLE_WAIT seconds (5), SNOOZE seconds (10), PING seconds (0.1), PGCONNECT_TIMEOUT
# seconds (10), SKIPLOCK_POOLER (none, session or transaction), PSQL (psql; on Debian /usr/bin/psql is a Perl
# wrapper: /usr/lib/postgresql/<version>/bin/psql starts faster). A setting that is not a number
# (BATCH an integer from 1 to 10000), or a STAGE that names no stage, stops the worker at once
# with exit code 2.
# SQL values always travel as psql variables (-v name=value, used as :'name'), never pasted into
# SQL text; psql does not expand variables in -c, so the SQL goes on stdin.

set -uo pipefail

# Started with SIGINT or SIGTERM ignored (a background job of a non-interactive shell starts with
# SIGINT ignored, and so do the children of many schedulers), bash cannot trap it: Ctrl-C would
# never stop the worker. Start again, once, with the default dispositions.
if [[ $(trap -p INT TERM) == *"''"* && -z ${SKIPLOCK_WORKER_REEXEC:-} ]]; then
    export SKIPLOCK_WORKER_REEXEC=1
    if env --default-signal=INT true 2> /dev/null; then
        exec env --default-signal=INT,TERM "$BASH" "$0" "$@"
    elif command -v perl > /dev/null; then
        exec perl -e '$SIG{INT} = $SIG{TERM} = "DEFAULT"; exec { $ARGV[0] } @ARGV or die "exec: $!\n"' "$BASH" "$0" "$@"
    fi
    echo "$0: started with SIGINT or SIGTERM ignored and cannot reset it: they will not stop the worker" >&2
fi
unset SKIPLOCK_WORKER_REEXEC

usage_error() { echo "$0: $*" >&2; exit 2; }
[[ -n ${DATABASE_URL:-} ]] || usage_error "set DATABASE_URL"
(( $# > 0 )) || usage_error "usage: $0 HANDLER [ARGS...]"
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
# A connection attempt that gets no answer (a server that accepts and never answers) fails after
# PGCONNECT_TIMEOUT seconds, 10 unless set, and is retried (libpq's own default waits for ever);
# a connect_timeout in DATABASE_URL wins.
export PGCONNECT_TIMEOUT=${PGCONNECT_TIMEOUT:-10}

number() {  # name value more-than: a decimal number above the bound, or exit 2
    [[ $2 =~ ^([0-9]+(\.[0-9]*)?|\.[0-9]+)$ ]] && awk -v v="$2" -v m="$3" 'BEGIN { exit !(v + 0 > m) }' ||
        usage_error "$1 must be a number of seconds above $3, not '$2'"
}
[[ $BATCH =~ ^[1-9][0-9]{0,4}$ ]] && (( BATCH <= 10000 )) || usage_error "BATCH must be an integer from 1 to 10000 (tasks a take), not '$BATCH'"
number LEASE "$LEASE" 0
number IDLE_WAIT "$IDLE_WAIT" 0
number PING "$PING" 0
number SNOOZE "$SNOOZE" -1
STAGES=() CHANNELS=() rest=$STAGE,
while [[ -n $rest ]]; do          # split at commas, trim blanks, drop empty names
    name=${rest%%,*} rest=${rest#*,}
    name=${name#"${name%%[![:space:]]*}"} name=${name%"${name##*[![:space:]]}"}
    [[ -n $name ]] || continue
    STAGES+=("$name")
    [[ $name == *'*' ]] || CHANNELS+=("skiplock.$name")   # a prefix has no channel
done
(( ${#STAGES[@]} > 0 )) || usage_error "STAGE must name a stage (names and prefixes 'x.*', comma-separated), not '$STAGE'"
# One name: take_next(stage), STAGE that name. Else take_next(stages[]), each row with its stage.
STAGE=${STAGES[0]} STAGE_LIST=$(IFS=,; echo "${STAGES[*]}")
[[ ${#STAGES[@]} == 1 && $STAGE != *'*' ]] && MULTI=false || MULTI=true
POOLER=${SKIPLOCK_POOLER:-none}
[[ $POOLER =~ ^(none|session|transaction)$ ]] || usage_error "SKIPLOCK_POOLER must be none, session or transaction, not '$POOLER'"
# No listener behind a transaction pooler (see above), nor for prefixes alone: the poll alone.
[[ $POOLER != transaction && ${#CHANNELS[@]} -gt 0 ]] && LISTENS=true || LISTENS=false

WORKER_NAME="$(hostname):$$"
BEAT=$(awk -v l="$LEASE" 'BEGIN { print l / 3 }')
IDLE_WAIT_US=$(awk -v w="$IDLE_WAIT" 'BEGIN { printf "%d", w * 1000000 }')
LEASE_US=$(awk -v l="$LEASE" 'BEGIN { printf "%d", l * 1000000 }')
# Children run in their own session: a terminal's Ctrl-C (SIGINT to the whole foreground process
# group) then reaches only this script, whose trap lets the batch in hand finish.
if command -v setsid > /dev/null; then
    ALONE=(setsid -w)
else
    ALONE=()
    echo "setsid not found: Ctrl-C will interrupt the running handler too (SIGTERM will not)" >&2
fi
WORKDIR=$(mktemp -d)
mkfifo "$WORKDIR/listen.in" "$WORKDIR/listen.out" || exit 1
listen_pid='' listen_to='' listen_from=''
turn=''                           # skiplock.turn after the last multi-stage take, in hex

stopping=false
trap 'stopping=true' TERM INT
trap : PIPE                       # a write to a dead listener fails (EPIPE) instead of killing us
trap 'stop_listener; rm -rf "$WORKDIR"' EXIT

sql() {  # SQL on stdin, values as -v arguments; prints unaligned, tab-separated rows
    "${ALONE[@]}" "$PSQL" -X -q -At -F $'\t' -v ON_ERROR_STOP=1 -v VERBOSITY=sqlstate -d "$DATABASE_URL" "$@"
}

take() {  # sets batch, one line per task: id, lease, attempt, stage, payload; returns 1 on failure
    # payload comes last: jsonb text has no tab or newline. The stage is '-' for the one STAGE, else
    # its name in hex (a stage may hold a tab or a newline); task_stage decodes it.
    if ! $MULTI; then
        batch=$(sql -v stage="$STAGE" -v batch="$BATCH" -v lease_for="$LEASE seconds" -v worker="$WORKER_NAME" <<'SQL'
SELECT id, lease, attempt, '-', payload
  FROM queue.take_next(stage => :'stage', batch => :'batch'::integer,
                       lease_for => :'lease_for'::interval, worker => :'worker')
SQL
        )
        return
    fi
    # Each psql is a new session: the round robin's position (skiplock.turn, which take_next reads
    # and sets) is set from the last take's and read back after this one, in one transaction (a
    # transaction pooler keeps it on one server connection). The last line is "turn", tab, its hex.
    local out
    out=$(sql -v stages="$STAGE_LIST" -v turn="$turn" -v batch="$BATCH" -v lease_for="$LEASE seconds" \
              -v worker="$WORKER_NAME" <<'SQL'
BEGIN;
SELECT pg_catalog.set_config('skiplock.turn', pg_catalog.convert_from(pg_catalog.decode(:'turn', 'hex'), 'UTF8'), false) \g /dev/null
SELECT id, lease, attempt, pg_catalog.encode(pg_catalog.convert_to(stage, pg_catalog.pg_client_encoding()), 'hex'), payload
  FROM queue.take_next(stages => pg_catalog.string_to_array(:'stages', ','), batch => :'batch'::integer,
                       lease_for => :'lease_for'::interval, worker => :'worker');
SELECT 'turn', pg_catalog.encode(pg_catalog.convert_to(coalesce(pg_catalog.current_setting('skiplock.turn', true), ''), 'UTF8'), 'hex');
COMMIT;
SQL
    ) || return 1
    [[ $out =~ (^|$'\n')turn$'\t'([0-9a-f]*)$ ]] || { echo "take_next: no turn in its answer" >&2; return 1; }
    turn=${BASH_REMATCH[2]}
    batch=${out%"${BASH_REMATCH[0]}"}
}

task_stage() {  # the take's stage column: sets stage ('-': STAGE; else the name, from its hex)
    local hex=$1 escaped='' i
    if [[ $hex == - ]]; then
        stage=$STAGE
        return
    fi
    for (( i = 0; i < ${#hex}; i += 2 )); do
        escaped+="\\x${hex:i:2}"
    done
    printf -v stage '%b' "$escaped"
}

finish() {  # id lease stage; prints t, or f when the lease was no longer ours
    sql -v id="$1" -v lease="$2" -v stage="$3" <<'SQL'
SELECT queue.finish(id => :'id'::bigint, lease => :'lease'::uuid, stage => :'stage')
SQL
}

release() {  # id lease stage seconds; prints t, or f when the lease was no longer ours
    sql -v id="$1" -v lease="$2" -v stage="$3" -v retry_in="$4 seconds" <<'SQL'
SELECT queue.release(id => :'id'::bigint, lease => :'lease'::uuid, retry_in => :'retry_in'::interval,
                     stage => :'stage')
SQL
}

fail() {  # id lease stage error fatal; prints t, or f when the lease was no longer ours
    sql -v id="$1" -v lease="$2" -v stage="$3" -v error="$4" -v fatal="$5" <<'SQL'
SELECT queue.fail(id => :'id'::bigint, lease => :'lease'::uuid, error => :'error', fatal => :'fatal'::boolean,
                  stage => :'stage')
SQL
}

heartbeat_batch() {  # the batch's lines; renews, in one psql session, each task still in hand
    # Values go in as -v id1=… -v lease1=… -v stage1=…; the script only names them. After each call
    # psql sets SQLSTATE (00000, or SK001 when the lease is lost), which \echo reports with the id.
    local args=() script='' n=0 id lease code stage rc state
    while IFS=$'\t' read -r id lease _ code _; do
        [[ -e $WORKDIR/ended.$id || -e $WORKDIR/lost.$id ]] && continue
        n=$((n + 1))
        task_stage "$code"
        args+=(-v "id$n=$id" -v "lease$n=$lease" -v "stage$n=$stage")
        script+="SELECT queue.heartbeat(id => :'id$n'::bigint, lease => :'lease$n'::uuid,"
        script+=" lease_for => :'lease_for'::interval, stage => :'stage$n') AS expires \\gset"$'\n'
        script+="\\echo :id$n :SQLSTATE"$'\n'
    done <<< "$1"
    (( n > 0 )) || return 0
    "${ALONE[@]}" "$PSQL" -X -q -At -v VERBOSITY=sqlstate -v lease_for="$LEASE seconds" -d "$DATABASE_URL" "${args[@]}" \
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

end_call() {  # id deadline_us CALL ARGS...: prints t or f; returns 1 when it gave up
    # The call is retried while psql fails (no connection, the server restarting), with a short
    # backoff, until deadline_us: by then the lease has run out and the task is surely not ours.
    # An answer, t or f, is final: f means the lease was lost (or an earlier try that reported a
    # failure had in fact gone through). An SQL error that no retry can mend ends it at once.
    # It runs in a command substitution: ignoring SIGINT there keeps a Ctrl-C (sent to the whole
    # process group) from killing this subshell or its sleep, and so from cutting the retries short.
    trap '' INT
    local id=$1 deadline=$2 out rc state delay=0.2 tries=0
    shift 2
    rm -f "$WORKDIR/call.refused"
    while :; do
        out=$("$@" 2> "$WORKDIR/call.err")
        rc=$?
        if (( rc == 0 )) && [[ $out == t || $out == f ]]; then
            echo "$out"
            return 0
        fi
        tries=$((tries + 1))
        state=$(grep -o -m 1 -E '(ERROR|FATAL): +[0-9A-Z]{5}' "$WORKDIR/call.err" | grep -o -E '[0-9A-Z]{5}$')
        if (( rc == 3 )) && [[ -n $state && ! $state =~ ^(08|40|53|57|58|55P03) ]]; then
            cat "$WORKDIR/call.err" >&2
            echo "$1 on $id failed with SQLSTATE $state; not retrying it" >&2
            : > "$WORKDIR/call.refused"   # the caller may try other values
            return 1
        fi
        if (( ${EPOCHREALTIME/./} >= deadline )); then
            cat "$WORKDIR/call.err" >&2
            echo "$1 on $id failed $tries times; giving up: its lease has run out" >&2
            return 1
        fi
        (( tries == 1 )) && { cat "$WORKDIR/call.err" >&2; echo "$1 on $id failed; retrying" >&2; }
        sleep "$delay"
        delay=$(awk -v d="$delay" 'BEGIN { d *= 2; print (d > 2 ? 2 : d) }')
    done
}

run_handler() {  # the handler, with the listener's pipes closed: they are not its business
    if [[ -n $listen_pid ]]; then
        "${ALONE[@]}" "${HANDLER[@]}" {listen_to}>&- {listen_from}<&-
    else
        "${ALONE[@]}" "${HANDLER[@]}"
    fi
}

run_task() {  # id lease attempt stage payload
    local id=$1 lease=$2 attempt=$3 stage=$4 payload=$5
    local errfile="$WORKDIR/stderr" rc ok deadline error fatal
    if [[ -e $WORKDIR/lost.$id ]]; then
        echo "lease lost on $id before it started: skipping it" >&2
        return
    fi
    TASK_ID=$id TASK_ATTEMPT=$attempt TASK_STAGE=$stage run_handler <<< "$payload" 2> "$errfile"
    rc=$?
    : > "$WORKDIR/ended.$id"
    deadline=$(( ${EPOCHREALTIME/./} + LEASE_US ))   # no heartbeat renews the lease from now on
    cat "$errfile" >&2
    if [[ -e $WORKDIR/lost.$id ]]; then
        echo "lease lost on $id: dropping the result" >&2
        return
    fi
    if (( rc == 0 )); then
        ok=$(end_call "$id" "$deadline" finish "$id" "$lease" "$stage")
    elif (( rc == SNOOZE_EXIT )); then
        ok=$(end_call "$id" "$deadline" release "$id" "$lease" "$stage" "$SNOOZE")
        [[ $ok == t ]] && echo "snoozed $id for $SNOOZE s" >&2
    else
        # psql cannot pass on text that is not UTF-8 (a character cut by tail -c, Latin-1 output):
        # iconv -c drops such bytes. Command substitution drops NUL bytes.
        error=$(tail -c 2000 "$errfile" | iconv -f UTF-8 -t UTF-8 -c 2> /dev/null)
        [[ -n $error ]] || error="handler exited with status $rc"
        fatal=$([[ $rc == "$FATAL_EXIT" ]] && echo true || echo false)
        ok=$(end_call "$id" "$deadline" fail "$id" "$lease" "$stage" "$error" "$fatal")
        if [[ -z $ok && -e $WORKDIR/call.refused ]]; then
            # The server refused the text itself, not the connection: record the exit status
            # rather than leave the task running until its lease runs out.
            ok=$(end_call "$id" "$deadline" fail "$id" "$lease" "$stage" "handler exited with status $rc; its stderr was refused" "$fatal")
        fi
    fi
    case $ok in
        t) ;;
        f) echo "lease lost on $id: its result was not recorded" >&2 ;;
        *) echo "could not record the result of $id: it runs again once its lease runs out" >&2 ;;
    esac
}

start_listener() {  # a psql that LISTENs, fed through one FIFO and read through another
    # Not a coproc: bash unsets a coproc's variables the moment it reaps it, and a dead listener
    # must be a condition the loop handles, not an unbound variable under set -u. The background
    # shell opens both FIFOs before it execs psql; the two opens below meet those, so neither
    # blocks for long. psql is the only writer of listen.out: its death is an EOF there.
    # One LISTEN a stage named; the channels go in as -v channel1=…, the script only names them.
    local args=() script='' n=0 channel
    for channel in "${CHANNELS[@]}"; do
        n=$((n + 1))
        args+=(-v "channel$n=$channel")
        script+="LISTEN :\"channel$n\";"
    done
    "${ALONE[@]}" "$PSQL" -X -q -At "${args[@]}" -d "$DATABASE_URL" \
        < "$WORKDIR/listen.in" > "$WORKDIR/listen.out" 2>&1 &
    listen_pid=$!
    exec {listen_to}> "$WORKDIR/listen.in" {listen_from}< "$WORKDIR/listen.out"
    echo "$script" >&"$listen_to" 2>/dev/null
}

stop_listener() {
    [[ -n $listen_pid ]] || return 0
    kill "$listen_pid" 2>/dev/null
    wait "$listen_pid" 2>/dev/null
    exec {listen_to}>&- {listen_from}<&-
    listen_pid='' listen_to='' listen_from=''
}

listener_died() {
    echo "the listener died; restarting it" >&2
    stop_listener
}

wait_for_work() {  # returns when notified, after IDLE_WAIT seconds, or on SIGTERM
    local line rc=0 deadline=$(( ${EPOCHREALTIME/./} + IDLE_WAIT_US ))
    if ! $LISTENS; then                     # no listener: the poll alone
        sleep "$IDLE_WAIT" & wait $!          # wait, unlike sleep, returns on SIGTERM
        kill $! 2>/dev/null
        return 0
    fi
    if [[ -z $listen_pid ]]; then
        start_listener            # it died: restart it, and take again before sleeping
        return 0
    fi
    while ! $stopping && (( ${EPOCHREALTIME/./} < deadline )); do
        echo 'SELECT 1;' >&"$listen_to" 2>/dev/null || { rc=1; break; }
        # The answer ("1"), then any notification, come at once; then nothing until the next ping.
        while :; do
            read -r -t "$PING" -u "$listen_from" line
            rc=$?
            (( rc == 0 )) || break
            [[ $line == 'Asynchronous notification'* ]] && return 0
            [[ $line == 1 ]] || echo "listener: $line" >&2
        done
        (( rc > 128 )) || break   # not a timeout (nor a signal): EOF, the listener died
    done
    if (( rc > 0 && rc <= 128 )); then
        listener_died
        $stopping || sleep 1      # the server may be down: do not spin on it
    fi
}

drain_listener() {  # after a batch: have psql read its socket, so notifications cannot pile up
    # psql reads the server only while it runs a command; left alone during long work, a busy
    # stage's notifications would fill the socket and stall the server's notification queue.
    local line rc
    [[ -n $listen_pid ]] || return 0
    echo 'SELECT 1; SELECT 2;' >&"$listen_to" 2>/dev/null || { listener_died; return 0; }
    while :; do
        read -r -t 5 -u "$listen_from" line
        rc=$?
        (( rc == 0 )) || break
        [[ $line == 2 ]] && return 0
    done
    (( rc > 128 )) || listener_died   # EOF: it died while the batch ran (not a timeout)
}

if $LISTENS; then
    start_listener                # LISTEN before the first take: no enqueue slips between
fi
while ! $stopping; do
    if ! take; then
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
    while IFS=$'\t' read -r id lease attempt code payload; do
        task_stage "$code"
        run_task "$id" "$lease" "$attempt" "$stage" "$payload" < /dev/null
    done <<< "$batch"
    kill "$beater" 2>/dev/null
    wait "$beater" 2>/dev/null
    rm -f "$WORKDIR"/ended.* "$WORKDIR"/lost.*
    drain_listener                # we take again at once: what it said is stale
done
exit 0
