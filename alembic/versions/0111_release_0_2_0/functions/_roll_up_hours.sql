-- _roll_up_hours(now): adds the runs of queue.history that finished in the whole minutes from
-- queue.finished_hours_clock up to 5 minutes before `now` to queue.finished_hours (per stage, UTC
-- hour and status), and moves the clock there. The margin is for finishes that commit late (a
-- history row carries a time taken inside its transaction): one committed within 5 minutes is
-- counted, a later one is not (history keeps it). Each minute is added once: the clock moves in
-- the same transaction, under an advisory lock ('skiplock.roll_up_hours'; a concurrent call
-- returns 0 at once; so does one that waits 100 ms for history's lock). At most a day a call (a
-- first call starts 8 days back); rows of hours over 8 days old are deleted as the hour turns.
-- Returns the minutes rolled up. Reads history one index range a stage; writes finished_hours and
-- the clock row. Internal: called by maintain().
CREATE OR REPLACE FUNCTION queue._roll_up_hours(now timestamptz)
    RETURNS integer
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
    -- A rotation in another session holds queue.history (ACCESS EXCLUSIVE) to its commit: skip a round.
    SET lock_timeout = '100ms'
AS $$
DECLARE
    v_key  CONSTANT bigint := pg_catalog.hashtextextended('skiplock.roll_up_hours', 0);
    v_to   timestamptz := pg_catalog.date_trunc('minute', _roll_up_hours.now - interval '5 minutes', 'UTC');
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
    v_from := GREATEST(v_from, pg_catalog.date_trunc('hour', v_to, 'UTC') - interval '8 days');
    v_to := LEAST(v_to, v_from + interval '1 day');
    BEGIN
        INSERT INTO queue.finished_hours AS f (stage, hour, status, runs, timed, run_time)
        SELECT h.stage, pg_catalog.date_trunc('hour', h.finished, 'UTC'), h.status, pg_catalog.count(*),
               pg_catalog.count(h.started), coalesce(pg_catalog.sum(h.finished - h.started), interval '0')
          FROM queue.history h
         WHERE h.stage = ANY (ARRAY(SELECT s.stage FROM queue._history_stages() AS s(stage)))  -- the index's leading column
           AND h.finished >= v_from AND h.finished < v_to
         GROUP BY 1, 2, 3
        ON CONFLICT ON CONSTRAINT finished_hours_pkey DO UPDATE
           SET runs = f.runs + excluded.runs, timed = f.timed + excluded.timed, run_time = f.run_time + excluded.run_time;
        IF pg_catalog.date_trunc('hour', v_from, 'UTC') <> pg_catalog.date_trunc('hour', v_to, 'UTC') THEN
            DELETE FROM queue.finished_hours f WHERE f.hour < pg_catalog.date_trunc('hour', v_to, 'UTC') - interval '8 days';
        END IF;
        UPDATE queue.finished_hours_clock SET rolled_to = v_to;
    EXCEPTION WHEN lock_not_available THEN
        RETURN 0;  -- nothing written; the next call rolls these minutes up
    END;
    RETURN (pg_catalog.date_part('epoch', v_to - v_from) / 60)::integer;
END
$$;
COMMENT ON FUNCTION queue._roll_up_hours(timestamptz) IS 'Internal: adds the runs finished up to 5 minutes ago (whole minutes, each once) to queue.finished_hours, and keeps its last 8 days. Called by maintain().';
REVOKE ALL ON FUNCTION queue._roll_up_hours(timestamptz) FROM PUBLIC;
