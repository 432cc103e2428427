-- _fail_attempt(task, attempt, worker, started, error, fatal, retry_in, now): end an attempt with an
-- error, for fail and fail_locked (which check the claim first). With fatal, or at the stage's
-- max_attempts-th attempt, the task is 'fatal': moved to queue.history (a periodic task is recorded
-- and re-armed, _rearm). Otherwise it waits as 'error' until now + retry_in, or the stage's backoff
-- (_retry_delay); due at once, it wakes the stage's waiting workers. attempt, worker and started are
-- the attempt's, as they go to queue.history; the error text is cut to 2,000 characters.
-- The caller has locked the row; history is written only for a row it deleted or re-armed.
-- Writes queue.live_tasks, and when fatal its end (_end_run: queue.history, or a count).
CREATE OR REPLACE FUNCTION queue._fail_attempt(task queue.live_tasks, attempt integer, worker text,
                                               started timestamptz, error text, fatal boolean,
                                               retry_in interval, now timestamptz)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_settings queue.stage_settings := queue._settings(task.stage);
    v_error    text := queue._bounded_error(coalesce(_fail_attempt.error, 'failed (no error text given)'));
    v_next     timestamptz;
BEGIN
    IF _fail_attempt.fatal OR _fail_attempt.attempt >= v_settings.max_attempts THEN
        IF task.repeat IS NOT NULL THEN  -- recorded fatal, re-armed: cancel() ends a schedule
            PERFORM queue._rearm(task, 'fatal', _fail_attempt.attempt, _fail_attempt.worker, v_error,
                                 _fail_attempt.started, _fail_attempt.now);
            RETURN;
        END IF;
        DELETE FROM queue.live_tasks t WHERE t.id = task.id AND t.stage = task.stage;
        IF FOUND THEN  -- history only for a row this deleted (never two final rows for one run)
            PERFORM queue._end_run(task, 'fatal', _fail_attempt.attempt, _fail_attempt.worker, v_error,
                                   _fail_attempt.started, _fail_attempt.now);
            IF task.waits < 0 THEN  -- something waits for it
                PERFORM queue._end_waits(task.id, 'fatal');
            END IF;
        END IF;
        RETURN;
    END IF;
    v_next := _fail_attempt.now + coalesce(_fail_attempt.retry_in, queue._retry_delay(v_settings, _fail_attempt.attempt));
    UPDATE queue.live_tasks t
       SET status = 'error', attempt = _fail_attempt.attempt, run_at = v_next,
           lease = NULL, lease_expires = NULL, error_text = v_error, updated = _fail_attempt.now
     WHERE t.id = task.id AND t.stage = task.stage;
    IF v_next <= _fail_attempt.now THEN
        PERFORM queue._wake_waiters(task.stage);
    END IF;
END
$$;
COMMENT ON FUNCTION queue._fail_attempt(queue.live_tasks, integer, text, timestamptz, text, boolean, interval, timestamptz) IS 'Internal, for fail and fail_locked: ends an attempt with an error, retried (error) or fatal (to queue.history; a periodic task is re-armed).';
REVOKE ALL ON FUNCTION queue._fail_attempt(queue.live_tasks, integer, text, timestamptz, text, boolean, interval, timestamptz) FROM PUBLIC;
