-- _raise_not_live(id, action, stage): the error for an admin action on a task that is not live.
-- stage, when given, is the caller's: only the task's rows in that stage are looked at.
CREATE OR REPLACE FUNCTION queue._raise_not_live(id bigint, action text, stage text DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_status queue.task_status;
BEGIN
    SELECT h.status INTO v_status
      FROM queue.history h
     WHERE h.id = _raise_not_live.id
       AND (_raise_not_live.stage IS NULL OR h.stage = _raise_not_live.stage)
     -- Rows of one transaction share a timestamp: on a tie the last event is cancelled, then
     -- fatal, then done (earlier rows at that instant are periodic runs, see retry).
     ORDER BY h.finished DESC, CASE h.status WHEN 'cancelled' THEN 0 WHEN 'fatal' THEN 1 ELSE 2 END
     LIMIT 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task % not found', _raise_not_live.id
            USING ERRCODE = 'P0002',
                  DETAIL = CASE WHEN _raise_not_live.stage IS NULL
                                THEN pg_catalog.format('No live or finished task has id %s.', _raise_not_live.id)
                                ELSE pg_catalog.format('No live or finished task of stage %s has id %s.',
                                                       pg_catalog.quote_literal(pg_catalog.left(_raise_not_live.stage, 80)),
                                                       _raise_not_live.id) END,
                  HINT = 'Look it up in queue.tasks; finished tasks leave history after the retention.';
    END IF;
    RAISE EXCEPTION 'cannot % task %: it is %', action, _raise_not_live.id, v_status
        USING ERRCODE = '55000',
              DETAIL = pg_catalog.format('Task %s finished as %s and is in queue.history.', _raise_not_live.id, v_status),
              HINT = CASE WHEN v_status IN ('fatal', 'cancelled') THEN 'queue.retry(id) queues it again.'
                          ELSE 'A done task cannot change; enqueue a new one.' END;
END
$$;
COMMENT ON FUNCTION queue._raise_not_live(bigint, text, text) IS 'Internal: raises P0002 when no task has the id, 55000 when it has finished.';
REVOKE ALL ON FUNCTION queue._raise_not_live(bigint, text, text) FROM PUBLIC;
