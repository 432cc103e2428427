-- configure_stage(stage, …): set a stage's policy; arguments left NULL keep their current value
-- (for a stage without a row: the defaults row '*'s); stage => '*' changes the defaults of every
-- stage without a row. Returns the stage's settings row.
--   max_running, group_limit  at most so many tasks of the stage, of one group_key, run at once;
--   paused       true: takes hand out nothing of the stage until it is set false again;
--   rate_limit   takes per rate_window (default 1 s), of each group_key with rate_per_group;
--   weight       tasks a multi-stage take serves from the stage in its turn (1 to 1000);
--   task_timeout how long a worker lets an attempt run (enforced by the workers). 0 removes a limit;
--   history      'all', 'failures' (fatal ends) or 'none': what queue.history keeps; runs not kept
--                are counted (queue.finished_counts); waiting tasks not locked now take the mode.
-- New limits apply to takes after commit; resuming or a new cap NOTIFYs the stage (unless off).
-- Raises 22004/22023 for a bad stage, 22023 for a value out of range or a history mode unknown or
-- given for '*'. Locks and writes the stage's row of queue.stage_settings; with history, the
-- stage's waiting tasks it can lock (SKIP LOCKED).
CREATE OR REPLACE FUNCTION queue.configure_stage(
        stage          text,
        lease_duration interval DEFAULT NULL,
        max_attempts   integer  DEFAULT NULL,
        backoff        text     DEFAULT NULL,
        backoff_base   interval DEFAULT NULL,
        backoff_cap    interval DEFAULT NULL,
        backoff_jitter real     DEFAULT NULL,
        notify         boolean  DEFAULT NULL,
        max_running    integer  DEFAULT NULL,
        group_limit    integer  DEFAULT NULL,
        paused         boolean  DEFAULT NULL,
        rate_limit     integer  DEFAULT NULL,
        rate_window    interval DEFAULT NULL,
        rate_burst     integer  DEFAULT NULL,
        rate_per_group boolean  DEFAULT NULL,
        weight         integer  DEFAULT NULL,
        task_timeout   interval DEFAULT NULL,
        history        text     DEFAULT NULL)
    RETURNS queue.stage_settings
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row queue.stage_settings;
    v_waiting text;
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN configure_stage.stage IS NULL OR configure_stage.stage = '' OR pg_catalog.octet_length(configure_stage.stage) > 54
                  THEN 'stage'  -- '*' is the defaults row
                  WHEN configure_stage.max_running < 0 THEN 'max_running'
                  WHEN configure_stage.rate_limit < 0 OR configure_stage.rate_burst < 0 THEN 'rate_limit, rate_burst'
                  WHEN configure_stage.group_limit < 0 THEN 'group_limit'
                  -- enqueue reads the mode from the stage's own row only (one probe), so '*' keeps all.
                  WHEN configure_stage.history NOT IN ('all', 'failures', 'none')
                       OR (configure_stage.stage = '*' AND configure_stage.history <> 'all') THEN 'history'
                  -- Past this, now() + a lease or a backoff can leave the timestamp range, and reap_hung (for
                  -- every stage at once) or the stage's takes would fail.
                  WHEN configure_stage.lease_duration > interval '100 years' OR configure_stage.backoff_base > interval '100 years'
                       OR configure_stage.backoff_cap > interval '100 years' OR configure_stage.task_timeout > interval '100 years'
                  THEN 'lease_duration, backoff_base, backoff_cap, task_timeout' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('configure_stage', v_bad, pg_catalog.jsonb_build_object(
            'stage', configure_stage.stage, 'max_running', configure_stage.max_running::text,
            'rate_limit', configure_stage.rate_limit::text, 'rate_burst', configure_stage.rate_burst::text,
            'group_limit', configure_stage.group_limit::text,
            'lease_duration', configure_stage.lease_duration::text,
            'backoff_base', configure_stage.backoff_base::text,
            'backoff_cap', configure_stage.backoff_cap::text,
            'task_timeout', configure_stage.task_timeout::text, 'history', configure_stage.history));
    END IF;
    -- </arguments>
    -- A new row starts as a copy of the defaults; then the columns given change under the row's
    -- lock, as the row is when written (a concurrent call's change, a pause say, is kept).
    BEGIN
        v_row := queue._settings(configure_stage.stage);
        v_row.stage := configure_stage.stage;
        INSERT INTO queue.stage_settings VALUES (v_row.*) ON CONFLICT ON CONSTRAINT stage_settings_pkey DO NOTHING;
        -- The caps are NULL when there is none; 0 is how a caller removes one.
        UPDATE queue.stage_settings s
           SET lease_duration = coalesce(configure_stage.lease_duration, s.lease_duration),
               max_attempts   = coalesce(configure_stage.max_attempts, s.max_attempts),
               backoff        = coalesce(configure_stage.backoff, s.backoff),
               backoff_base   = coalesce(configure_stage.backoff_base, s.backoff_base),
               backoff_cap    = coalesce(configure_stage.backoff_cap, s.backoff_cap),
               backoff_jitter = coalesce(configure_stage.backoff_jitter, s.backoff_jitter),
               notify         = coalesce(configure_stage.notify, s.notify),
               max_running    = CASE WHEN configure_stage.max_running IS NULL THEN s.max_running
                                     ELSE NULLIF(configure_stage.max_running, 0) END,
               group_limit    = CASE WHEN configure_stage.group_limit IS NULL THEN s.group_limit
                                     ELSE NULLIF(configure_stage.group_limit, 0) END,
               paused         = coalesce(configure_stage.paused, s.paused),
               rate_limit     = CASE WHEN configure_stage.rate_limit IS NULL THEN s.rate_limit
                                     ELSE NULLIF(configure_stage.rate_limit, 0) END,
               rate_window    = coalesce(configure_stage.rate_window, s.rate_window),
               -- No limit, no burst: a burst left over would refuse the next, lower limit.
               rate_burst     = CASE WHEN configure_stage.rate_limit = 0 THEN NULL
                                     WHEN configure_stage.rate_burst IS NULL THEN s.rate_burst
                                     ELSE NULLIF(configure_stage.rate_burst, 0) END,
               rate_per_group = coalesce(configure_stage.rate_per_group, s.rate_per_group),
               weight         = coalesce(configure_stage.weight, s.weight),
               task_timeout   = CASE WHEN configure_stage.task_timeout IS NULL THEN s.task_timeout
                                     ELSE NULLIF(configure_stage.task_timeout, interval '0') END,
               history        = CASE WHEN configure_stage.history IS NULL THEN s.history
                                     ELSE NULLIF(configure_stage.history, 'all') END,
               updated        = pg_catalog.now()
         WHERE s.stage = configure_stage.stage
        RETURNING s.* INTO v_row;
    EXCEPTION WHEN check_violation THEN
        PERFORM queue._raise_bad_argument('configure_stage', 'settings', pg_catalog.jsonb_build_object('settings', SQLERRM));
    END;
    -- The stage's waiting tasks take the new mode (enqueue stamps each task with it), but for those a
    -- transaction holds now (take_locked, a drain): they keep the mode they have, as one enqueued
    -- at the same time as this call may. The totals count every run either way. SQL tasks keep all.
    IF configure_stage.history IS NOT NULL AND configure_stage.stage <> '*' THEN
        UPDATE queue.live_tasks t
           SET history = v_row.history
         WHERE t.stage = configure_stage.stage
           AND t.ctid = ANY (ARRAY(SELECT c.ctid
                                     FROM queue.live_tasks c
                                    WHERE c.stage = configure_stage.stage AND c.status <> 'running'
                                      AND c.run_as IS NULL AND c.history IS DISTINCT FROM v_row.history
                                      FOR UPDATE SKIP LOCKED));
    END IF;
    -- Resuming a stage or changing a cap can make tasks takeable at once: wake the workers that
    -- wait on it (for '*', on any stage that has had one). Whatever their mark's age: a take
    -- from a paused stage, or one at its cap, returns without renewing it. One NOTIFY a call.
    IF configure_stage.paused IS FALSE OR configure_stage.max_running IS NOT NULL
       OR configure_stage.group_limit IS NOT NULL OR configure_stage.rate_limit IS NOT NULL THEN
        FOR v_waiting IN SELECT w.stage FROM queue.stage_waiters w WHERE configure_stage.stage = '*'
                         UNION
                         SELECT configure_stage.stage WHERE configure_stage.stage <> '*' LOOP
            IF (queue._settings(v_waiting)).notify THEN
                PERFORM pg_catalog.pg_notify('skiplock.' || v_waiting, '');
            END IF;
        END LOOP;
    END IF;
    RETURN v_row;
END
$$;
COMMENT ON FUNCTION queue.configure_stage(text, interval, integer, text, interval, interval, real, boolean, integer, integer, boolean, integer, interval, integer, boolean, integer, interval, text) IS 'Sets a stage''s policy (NULL keeps a value; ''*'' sets the defaults): lease, retries, wake-ups, max_running, group_limit, rate_limit and task_timeout (0 removes each), paused, weight, history. 22023 for an invalid value. Writes queue.stage_settings.';
REVOKE ALL ON FUNCTION queue.configure_stage(text, interval, integer, text, interval, interval, real, boolean, integer, integer, boolean, integer, interval, integer, boolean, integer, interval, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.configure_stage(text, interval, integer, text, interval, interval, real, boolean, integer, integer, boolean, integer, interval, integer, boolean, integer, interval, text) TO skiplock_admin;
