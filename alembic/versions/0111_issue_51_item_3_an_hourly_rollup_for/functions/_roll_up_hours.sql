-- _roll_up_hours(now): rolls queue.history up into queue.finished_hours for every UTC hour that
-- ended at least 10 minutes before `now` (a finish's row carries its transaction's start time and
-- may commit later: those that commit within the margin are counted) and is not rolled up yet,
-- at most the last 8 days; then deletes the rows older than 8 days and moves
-- queue.finished_hours_clock forward. Cheap when nothing is due: one read of the clock row.
-- Concurrent calls: the one that takes the advisory lock rolls, the others return 0 at once.
-- Re-running an hour adds nothing (ON CONFLICT DO NOTHING).
-- Returns the hours rolled up (0 when none was due). Reads history one index range a stage;
-- writes finished_hours and the clock row (its transaction's advisory lock
-- 'skiplock.roll_up_hours'). Internal: called by maintain().
CREATE OR REPLACE FUNCTION queue._roll_up_hours(now timestamptz)
    RETURNS integer
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key  CONSTANT bigint := pg_catalog.hashtextextended('skiplock.roll_up_hours', 0);
    v_to   timestamptz := pg_catalog.date_trunc('hour', _roll_up_hours.now - interval '10 minutes', 'UTC');
    v_from timestamptz;
BEGIN
    SELECT c.rolled_to INTO v_from FROM queue.finished_hours_clock c;
    IF v_from >= v_to THEN
        RETURN 0;
    END IF;
    IF NOT pg_catalog.pg_try_advisory_xact_lock(v_key) THEN
        RETURN 0;  -- another session is rolling up
    END IF;
    -- Read again holding the lock: the session that held it before may have just rolled up.
    SELECT c.rolled_to INTO v_from FROM queue.finished_hours_clock c;
    IF v_from >= v_to THEN
        RETURN 0;
    END IF;
    v_from := GREATEST(v_from, v_to - interval '8 days');
    INSERT INTO queue.finished_hours AS f (stage, hour, status, runs, timed, run_time)
    SELECT h.stage, pg_catalog.date_trunc('hour', h.finished, 'UTC'), h.status, pg_catalog.count(*),
           pg_catalog.count(h.started), pg_catalog.sum(h.finished - h.started)
      FROM queue.history h
     WHERE h.stage = ANY (ARRAY(SELECT s.stage FROM queue._history_stages() AS s(stage)))  -- the index's leading column
       AND h.finished >= v_from AND h.finished < v_to
     GROUP BY 1, 2, 3
    ON CONFLICT ON CONSTRAINT finished_hours_pkey DO NOTHING;
    DELETE FROM queue.finished_hours f WHERE f.hour < v_to - interval '8 days';
    UPDATE queue.finished_hours_clock SET rolled_to = v_to;
    RETURN (pg_catalog.date_part('epoch', v_to - v_from) / 3600)::integer;
END
$$;
COMMENT ON FUNCTION queue._roll_up_hours(timestamptz) IS 'Internal: counts the finished runs of each UTC hour that closed 10 minutes ago into queue.finished_hours (once), keeps its last 8 days. Called by maintain().';
REVOKE ALL ON FUNCTION queue._roll_up_hours(timestamptz) FROM PUBLIC;
