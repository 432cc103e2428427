-- finish_and_take(finished_id, finished_lease, stage, batch, lease_for, worker, finished_result): a
-- worker's loop step in one call and one commit: finish() the attempt it just completed (with
-- finished_result as its result, if given), then take_next() from the stage (half the commits of
-- the two calls, for workers that take one short task at a time).
-- Returns the taken tasks as take_next does, each with `finished` (what finish() returned for
-- finished_id); when nothing is due, one row with `finished` and every other column NULL.
-- finished_id and finished_lease both NULL: nothing to finish (the first call of a loop).
-- Raises 22004 when only one of them is NULL, and what finish() and take_next() raise.
-- Locks and writes what finish() and take_next() do.
-- The finished task must be of stage (one shard on Citus): one of another stage is not finished.
CREATE OR REPLACE FUNCTION queue.finish_and_take(
        finished_id     bigint,
        finished_lease  uuid,
        stage           text     DEFAULT 'default',
        batch           integer  DEFAULT 1,
        lease_for       interval DEFAULT NULL,
        worker          text     DEFAULT NULL,
        finished_result jsonb    DEFAULT NULL)
    RETURNS TABLE (finished boolean, id bigint, payload jsonb, attempt integer, lease uuid,
                   lease_expires timestamptz, priority integer, key text)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_finished boolean;
    v_bad   text;    -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN (finish_and_take.finished_id IS NULL) <> (finish_and_take.finished_lease IS NULL)
                  THEN 'finished_id, finished_lease' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('finish_and_take', v_bad, pg_catalog.jsonb_build_object(
            'finished_id', finish_and_take.finished_id::text,
            'finished_lease', finish_and_take.finished_lease::text));
    END IF;
    -- </arguments>
    IF finish_and_take.finished_id IS NOT NULL THEN
        v_finished := queue.finish(finish_and_take.finished_id, finish_and_take.finished_lease,
                                   stage => finish_and_take.stage, result => finish_and_take.finished_result);
    END IF;
    RETURN QUERY
    SELECT v_finished, k.id, k.payload, k.attempt, k.lease, k.lease_expires, k.priority, k.key
      FROM queue.take_next(finish_and_take.stage, finish_and_take.batch, finish_and_take.lease_for,
                           finish_and_take.worker) k;
    IF NOT FOUND THEN
        finished := v_finished;
        RETURN NEXT;
    END IF;
END
$$;
COMMENT ON FUNCTION queue.finish_and_take(bigint, uuid, text, integer, interval, text, jsonb) IS 'A worker''s loop step in one commit: finishes (finished_id, finished_lease) as finish() does (with finished_result), then takes up to batch tasks as take_next() does, each returned with finished; one row with only finished when nothing is due.';
REVOKE ALL ON FUNCTION queue.finish_and_take(bigint, uuid, text, integer, interval, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.finish_and_take(bigint, uuid, text, integer, interval, text, jsonb) TO skiplock_worker, skiplock_admin;
