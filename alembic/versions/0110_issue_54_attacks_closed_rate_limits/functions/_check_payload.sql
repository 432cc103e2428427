-- _check_payload(payload): raises unless payload is a JSON object or array of at most 1 MiB.
-- The limit bounds what a reader gets: the value's size uncompressed. pg_column_size of a value
-- read from a table column is its stored, perhaps compressed, size (a 200 MB jsonb of repeated
-- text takes under 1 MB), so a compressed value (pg_column_compression) is measured decompressed:
-- payload || '{}' (or '[]'), the same value, detoasted. Callers' fast paths send a compressed
-- value here; the others never decompress.
CREATE OR REPLACE FUNCTION queue._check_payload(payload jsonb)
    RETURNS void
    LANGUAGE plpgsql
    IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_size integer;
BEGIN
    IF payload IS NULL THEN
        RAISE EXCEPTION 'payload must not be NULL'
            USING ERRCODE = '22004', DETAIL = 'The payload is NULL.',
                  HINT = 'Pass ''{}'' for a task without data.';
    END IF;
    IF pg_catalog.jsonb_typeof(payload) NOT IN ('object', 'array') THEN
        RAISE EXCEPTION 'payload must be a JSON object or array'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The payload is a JSON %s.', pg_catalog.jsonb_typeof(payload)),
                  HINT = 'Wrap the value, e.g. {"value": 42}.';
    END IF;
    v_size := CASE WHEN pg_catalog.pg_column_compression(payload) IS NULL THEN pg_catalog.pg_column_size(payload)
                   ELSE pg_catalog.pg_column_size(payload || CASE pg_catalog.jsonb_typeof(payload)
                                                                WHEN 'object' THEN '{}'::jsonb ELSE '[]'::jsonb END)
              END;
    IF v_size > 1048576 THEN
        RAISE EXCEPTION 'payload too large'
            USING ERRCODE = '54000',
                  DETAIL = pg_catalog.format('The payload takes %s bytes uncompressed; the limit is 1048576.', v_size),
                  HINT = 'Store large data elsewhere and put its address in the payload.';
    END IF;
END
$$;
COMMENT ON FUNCTION queue._check_payload(jsonb) IS 'Internal: raises 22004 for a NULL payload, 22023 for a JSON scalar, 54000 for one over 1 MiB (uncompressed: the size a reader gets).';
REVOKE ALL ON FUNCTION queue._check_payload(jsonb) FROM PUBLIC;
