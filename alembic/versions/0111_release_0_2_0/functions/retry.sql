-- retry(id, stage): an admin queues a failed task again now, from attempt 0: an 'error' task waiting for
-- its retry, or a 'fatal' or 'cancelled' task from queue.history (its history row goes back to
-- queue.live_tasks). A ready task is left as it is. A periodic task that was cancelled comes back
-- as a one-off run (history does not keep the schedule: enqueue it again to restore it).
-- Wakes the stage's waiting workers (_wake_waiters).
-- Raises 22004 for a NULL id, P0002 for an unknown id, 55000 for a running or done task, SK002 when
-- a live task has taken its key, 0A000 on Citus without a stage. Locks the task's row; writes
-- queue.live_tasks, queue.history and queue.finished_dropped. stage, when given, is the task's last stage (routes the call
-- on Citus); any other: P0002 or 55000.
CREATE OR REPLACE FUNCTION queue.retry(id bigint, stage text DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now    timestamptz := pg_catalog.now();
    v_status queue.task_status_live;
    v_last   record;  -- a queue.history row and its ctid
    v_stage  text;
    v_found  boolean;
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN retry.id IS NULL THEN 'id' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('retry', v_bad, pg_catalog.jsonb_build_object('id', retry.id::text));
    END IF;
    -- </arguments>
    BEGIN
        SELECT t.status INTO v_status
          FROM queue.live_tasks t
         WHERE t.id = retry.id AND (retry.stage IS NULL OR t.stage = retry.stage)
           FOR UPDATE;
    EXCEPTION WHEN feature_not_supported THEN  -- Citus: no row locks across shards
        RAISE EXCEPTION 'retry needs the task''s stage on Citus'
            USING ERRCODE = '0A000', DETAIL = SQLERRM,
                  HINT = 'Call queue.retry(id, stage): the stage routes the call to the shard that holds the task.';
    END;
    IF FOUND THEN
        IF v_status = 'running' THEN
            RAISE EXCEPTION 'cannot retry task %: it is running', retry.id
                USING ERRCODE = '55000',
                      DETAIL = 'A worker holds a lease on it.',
                      HINT = 'Wait for it to finish or fail, or cancel it first.';
        END IF;
        UPDATE queue.live_tasks t
           SET status = 'ready', run_at = v_now, attempt = 0, updated = v_now
         WHERE t.id = retry.id AND (retry.stage IS NULL OR t.stage = retry.stage) AND t.status = 'error'
        RETURNING t.stage INTO v_stage;
        IF FOUND THEN
            PERFORM queue._wake_waiters(v_stage);
        END IF;
        RETURN;
    END IF;

    SELECT h.*, h.ctid AS row_ctid INTO v_last
      FROM queue.history h
     WHERE h.id = retry.id AND (retry.stage IS NULL OR h.stage = retry.stage)
     -- Rows of one transaction share a timestamp. Only the task's last event took it out of
     -- queue.live_tasks; what can precede it at the same instant are periodic runs (done or
     -- fatal, after which the task was re-armed). A cancel always ends the task and a done or
     -- fatal ends it only as a one-off, so on a tie: cancelled, then fatal, then done.
     ORDER BY h.finished DESC, CASE h.status WHEN 'cancelled' THEN 0 WHEN 'fatal' THEN 1 ELSE 2 END
     LIMIT 1
       FOR UPDATE;
    v_found := FOUND;
    -- A concurrent retry may have moved it back while this one waited for its history row (then
    -- this one read the next older row, or none): it is live again, as this caller wants, or
    -- running, the error above.
    SELECT t.status INTO v_status
      FROM queue.live_tasks t
     WHERE t.id = retry.id AND (retry.stage IS NULL OR t.stage = retry.stage);
    IF v_status IN ('ready', 'error') THEN
        RETURN;
    ELSIF v_status = 'running' THEN
        RAISE EXCEPTION 'cannot retry task %: it is running', retry.id
            USING ERRCODE = '55000',
                  DETAIL = 'A worker holds a lease on it.',
                  HINT = 'Wait for it to finish or fail, or cancel it first.';
    END IF;
    IF NOT v_found OR v_last.status = 'done' THEN
        PERFORM queue._raise_not_live(retry.id, 'retry', retry.stage);
    END IF;
    BEGIN
        INSERT INTO queue.live_tasks (id, stage, status, priority, run_at, payload, key, attempt,
                                      worker, error_text, created, updated, group_key, run_as, history)
        OVERRIDING SYSTEM VALUE
        VALUES (v_last.id, v_last.stage, 'ready', v_last.priority, v_now, v_last.payload, v_last.key, 0,
                v_last.worker, v_last.error_text, v_last.created, v_now, v_last.group_key, v_last.run_as,
                -- the stage's history mode now, as enqueue stamps it (an SQL task keeps all)
                CASE WHEN v_last.run_as IS NULL THEN (queue._settings(v_last.stage)).history END);
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'cannot retry task %: its key is taken', retry.id
            USING ERRCODE = 'SK002',
                  DETAIL = pg_catalog.format('A live task of stage %s has key %s.',
                                             pg_catalog.quote_literal(v_last.stage), pg_catalog.quote_literal(v_last.key)),
                  HINT = 'Cancel or finish that task first.';
    END;
    -- This row only: two rows of one instant can have the same status (fatal, cancel, retry and
    -- fatal again in one transaction). Locked above, so its ctid holds.
    DELETE FROM queue.history h
     WHERE h.id = v_last.id AND h.stage = v_last.stage AND h.finished = v_last.finished
       AND h.ctid = v_last.row_ctid;
    PERFORM queue._count_dropped(v_last.stage, v_last.status, 1);  -- the run stays counted (finished_totals)
    PERFORM queue._wake_waiters(v_last.stage);
END
$$;
COMMENT ON FUNCTION queue.retry(bigint, text) IS 'Queues a failed task (error, fatal or cancelled) again now from attempt 0 (a cancelled periodic task as a one-off run). Raises 22004 for a NULL id, P0002 for an unknown id, 55000 for a running or done task, SK002 when a live task took its key.';
REVOKE ALL ON FUNCTION queue.retry(bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.retry(bigint, text) TO skiplock_admin;
