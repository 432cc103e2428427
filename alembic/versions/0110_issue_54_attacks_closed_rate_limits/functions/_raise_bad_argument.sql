-- _raise_bad_argument(caller, argument, given, given2): raises the error for a bad argument that
-- several worker-API functions share, each error written once: 'id, lease' (22004, either NULL),
-- 'id' and 'fatal' (22004, NULL), 'retry_in' (22023, negative), 'worker' (22023, over 200
-- characters), 'batch' (22023, out of 1..10000), 'limits' (0A000, the stage has max_running,
-- group_limit or rate_limit). given and given2 are the values as text, for the DETAIL (limits: the stage).
-- Callers test the condition inline and call this only when it fails: the hot path pays nothing.
-- Raises always; reads and writes nothing.
CREATE OR REPLACE FUNCTION queue._raise_bad_argument(caller text, argument text, given text DEFAULT NULL,
                                                     given2 text DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    CASE _raise_bad_argument.argument
    WHEN 'id, lease' THEN
        RAISE EXCEPTION 'id and lease must not be NULL'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format('%s was called with id %s and lease %s.', caller,
                                             coalesce(given, 'NULL'), coalesce(given2, 'NULL')),
                  HINT = 'Pass the id and lease that take_next returned.';
    WHEN 'id' THEN
        RAISE EXCEPTION 'id must not be NULL'
            USING ERRCODE = '22004', DETAIL = pg_catalog.format('%s was called with id NULL.', caller),
                  HINT = 'Pass the id that take_locked returned.';
    WHEN 'fatal' THEN
        RAISE EXCEPTION 'fatal must not be NULL'
            USING ERRCODE = '22004', DETAIL = pg_catalog.format('%s was called with fatal NULL.', caller),
                  HINT = 'Pass fatal => true to end the task for good, or false (the default) to retry it.';
    WHEN 'retry_in' THEN
        RAISE EXCEPTION 'retry_in must not be negative'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('retry_in is %s.', given),
                  HINT = CASE caller WHEN 'release' THEN 'Use NULL (the default) to hand the task back at once in its old place.'
                                     ELSE 'Use interval ''0'' to retry at once, or NULL for the stage''s backoff.' END;
    WHEN 'worker' THEN
        RAISE EXCEPTION 'worker name too long'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('The worker name has %s characters.', pg_catalog.length(given)),
                  HINT = 'Name workers in at most 200 characters, e.g. host:pid.';
    WHEN 'batch' THEN
        RAISE EXCEPTION 'batch out of range'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('batch is %s.', coalesce(given, 'NULL')),
                  HINT = CASE caller WHEN 'consume' THEN 'Consume' ELSE 'Take' END || ' 1 to 10000 tasks per call.';
    WHEN 'limits' THEN
        RAISE EXCEPTION 'stage % has concurrency limits', pg_catalog.quote_literal(given)
            USING ERRCODE = '0A000',
                  DETAIL = 'max_running and group_limit count running tasks, rate_limit counts takes under the stage''s lock; '
                           || CASE caller WHEN 'consume' THEN 'consume records tasks as done without running them.'
                                          ELSE 'a task taken with take_locked stays ''ready''.' END,
                  HINT = 'Take from this stage with take_next, or lift its limits with configure_stage.';
    END CASE;
END
$$;
COMMENT ON FUNCTION queue._raise_bad_argument(text, text, text, text) IS 'Internal: raises the shared error for a bad argument of a worker-API call (id, lease, fatal, retry_in, worker, batch, limits).';
REVOKE ALL ON FUNCTION queue._raise_bad_argument(text, text, text, text) FROM PUBLIC;
