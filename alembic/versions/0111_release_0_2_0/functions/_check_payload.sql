-- _check_payload(payload, argument): raises unless payload is a JSON object or array of at most 1 MiB.
-- argument names the value in the messages: 'payload' (enqueue, schedule), 'result' (finish and
-- its kin), 'progress' (heartbeat); results and progress are bounded exactly as payloads.
-- The limit bounds what a reader gets: the value's size uncompressed. pg_column_size of a value
-- read from a table column is its stored, perhaps compressed, size (a 200 MB jsonb of repeated
-- text takes under 1 MB), so a compressed value (pg_column_compression) is measured decompressed:
-- payload || '{}' (or '[]'), the same value, detoasted. Callers' fast paths send a compressed
-- value here; the others never decompress.
CREATE OR REPLACE FUNCTION queue._check_payload(payload jsonb, argument text DEFAULT 'payload')
    RETURNS void
    LANGUAGE plpgsql
    IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_size integer;
BEGIN
    IF payload IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', argument
            USING ERRCODE = '22004', DETAIL = pg_catalog.format('The %s is NULL.', argument),
                  HINT = 'Pass ''{}'' for a task without data.';
    END IF;
    IF pg_catalog.jsonb_typeof(payload) NOT IN ('object', 'array') THEN
        RAISE EXCEPTION '% must be a JSON object or array', argument
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The %s is a JSON %s.', argument, pg_catalog.jsonb_typeof(payload)),
                  HINT = 'Wrap the value, e.g. {"value": 42}.';
    END IF;
    v_size := CASE WHEN pg_catalog.pg_column_compression(payload) IS NULL THEN pg_catalog.pg_column_size(payload)
                   ELSE pg_catalog.pg_column_size(payload || CASE pg_catalog.jsonb_typeof(payload)
                                                                WHEN 'object' THEN '{}'::jsonb ELSE '[]'::jsonb END)
              END;
    IF v_size > 1048576 THEN
        RAISE EXCEPTION '% too large', argument
            USING ERRCODE = '54000',
                  DETAIL = pg_catalog.format('The %s takes %s bytes uncompressed; the limit is 1048576.', argument, v_size),
                  HINT = pg_catalog.format('Store large data elsewhere and put its address in the %s.', argument);
    END IF;
END
$$;
COMMENT ON FUNCTION queue._check_payload(jsonb, text) IS 'Internal: raises 22004 for a NULL payload (or result, progress: argument names it), 22023 for a JSON scalar, 54000 for one over 1 MiB (uncompressed: the size a reader gets).';
REVOKE ALL ON FUNCTION queue._check_payload(jsonb, text) FROM PUBLIC;
