#!/usr/bin/env bash
# Enqueue tasks with psql: one JSON payload per argument, or per line of stdin (JSON Lines).
#
#   DATABASE_URL=postgresql://... ./producer.sh '{"n": 1}' '{"n": 2}'
#   seq 1000 | jq -c '{n: .}' | DATABASE_URL=... STAGE=resize ./producer.sh
#
# All payloads travel in one psql variable (never pasted into SQL text), are split into lines by
# the server and go in one call to queue.enqueue_batch: one transaction, one NOTIFY. Prints the
# new ids, one a line. Use queue.enqueue(payload, stage, key => ...) for keyed tasks.

set -euo pipefail
: "${DATABASE_URL:?set DATABASE_URL}"
# A server that accepts and never answers: psql gives up after 10 s (libpq alone waits for ever);
# PGCONNECT_TIMEOUT or a connect_timeout in DATABASE_URL sets another bound.
export PGCONNECT_TIMEOUT=${PGCONNECT_TIMEOUT:-10}

if (( $# > 0 )); then
    payloads=$(printf '%s\n' "$@")
else
    payloads=$(cat)
fi

psql -X -q -At -v ON_ERROR_STOP=1 -d "$DATABASE_URL" \
     -v payloads="$payloads" -v stage="${STAGE:-default}" <<'SQL'
SELECT queue.enqueue_batch(
           payloads => ARRAY(SELECT line::jsonb
                               FROM regexp_split_to_table(:'payloads', '\n') WITH ORDINALITY AS l(line, n)
                              WHERE btrim(line) <> ''
                              ORDER BY n),
           stage => :'stage')
SQL
