-- maintain(now): the one entry point for housekeeping; call it every second or every minute, from
-- one or many sessions, as skiplock_admin, in its own transaction. `now` is the time rotation works
-- with (tests inject it); reaping uses the transaction's now(). Steps, each only when due:
--   reap_hung, fire_schedules: expired leases, due cron ticks (queue.<step>()).
--   roll_up_hours      finished runs into queue.finished_hours a minute at a time (_roll_up_hours).
--   rotate_partitions  when history_policy.last_rotated is older than rotate_every (one session).
--   stage_waiters      marks of stages no worker waits on any more (queue._forget_waiters()).
--   finished_counts    runs counted, not kept: hours merged, after 7 days to finished_dropped.
--   compact            when queue._compaction_due() says the hot table is mostly free space; last,
--                      as its ACCESS EXCLUSIVE lock lasts until commit; skipped after a rotation that
--                      changed partitions; cancels an autovacuum in its way, steps around a VACUUM.
-- Returns a row per step (task, count, detail). Cheap when nothing is due: index probes, rows,
-- statistics; written: reap_hung's clock (every 10 s), the rollup (a minute). 22004 for a NULL now.
CREATE OR REPLACE FUNCTION queue.maintain(now timestamptz DEFAULT pg_catalog.now())
    RETURNS TABLE (task text, count integer, detail text)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The same key rotate_partitions() takes (advisory locks nest within a session).
    v_key     CONSTANT bigint := pg_catalog.hashtextextended('skiplock.rotate_partitions', 0);
    v_policy  queue.history_policy;
    v_reaped  integer;
    v_fired   integer;
    v_forgot  integer;
    v_folded  integer;
    v_compact_key CONSTANT bigint := pg_catalog.hashtextextended('skiplock.compact', 0);
    v_done    text;
    v_due     boolean;
    v_before  bigint;
    v_after   bigint;
    v_unvacuumed boolean;
    v_lock_timeout text;
    v_rotated boolean := false;
    v_minutes integer;
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN maintain.now IS NULL THEN 'now' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('maintain', v_bad, pg_catalog.jsonb_build_object(
            'now', maintain.now::text));
    END IF;
    -- </arguments>

    v_reaped := queue.reap_hung();
    task := 'reap_hung';
    count := v_reaped;
    detail := CASE WHEN v_reaped = 0 THEN 'no expired lease'
                   ELSE pg_catalog.format('%s tasks with an expired lease recovered', v_reaped) END;
    RETURN NEXT;

    v_fired := queue.fire_schedules(maintain.now);
    task := 'fire_schedules';
    count := v_fired;
    detail := CASE WHEN v_fired = 0 THEN 'no schedule due'
                   ELSE pg_catalog.format('%s scheduled tasks enqueued', v_fired) END;
    RETURN NEXT;

    v_minutes := queue._roll_up_hours(maintain.now);
    task := 'roll_up_hours';
    count := v_minutes;
    detail := CASE WHEN v_minutes = 0 THEN 'nothing to roll up'
                   ELSE pg_catalog.format('%s min of finished runs rolled up into finished_hours', v_minutes) END;
    RETURN NEXT;

    task := 'rotate_partitions';
    count := 0;
    SELECT p.* INTO STRICT v_policy FROM queue.history_policy p;
    IF NOT queue._rotation_due(v_policy, maintain.now) THEN
        detail := pg_catalog.format('not due: last rotated at %s, next after %s (rotate_every %s)',
                      v_policy.last_rotated, v_policy.last_rotated + v_policy.rotate_every, v_policy.rotate_every);
    ELSIF NOT pg_catalog.pg_try_advisory_xact_lock(v_key) THEN
        detail := 'due, but another session is rotating';
    ELSE
        -- Read again holding the lock: the session that held it before may have just rotated.
        SELECT p.* INTO STRICT v_policy FROM queue.history_policy p;
        IF NOT queue._rotation_due(v_policy, maintain.now) THEN
            detail := pg_catalog.format('not due: another session rotated at %s', v_policy.last_rotated);
        ELSE
            SELECT pg_catalog.count(*)::integer,
                   pg_catalog.string_agg(r.action || coalesce(' ' || r.partition, ''), '; ' ORDER BY r.n),
                   coalesce(pg_catalog.bool_or(r.action IN ('created', 'dropped', 'detached')), false)
              INTO count, v_done, v_rotated
              FROM queue.rotate_partitions(maintain.now) WITH ORDINALITY AS r(action, partition, detail, n);
            detail := coalesce(v_done, 'nothing to do');
        END IF;
    END IF;
    RETURN NEXT;

    -- Marks of stages no worker waits on any more: without this, every stage name a worker ever
    -- waited on would keep its row.
    v_forgot := queue._forget_waiters();
    task := 'stage_waiters';
    count := v_forgot;
    detail := CASE WHEN v_forgot = 0 THEN 'no stale waiting mark'
                   ELSE pg_catalog.format('%s stale waiting marks deleted', v_forgot) END;
    RETURN NEXT;
    -- Runs counted without history rows: without this, a row per backend and minute would stay.
    v_folded := queue._fold_counts();
    task := 'finished_counts';
    count := v_folded;
    detail := CASE WHEN v_folded = 0 THEN 'nothing to fold'
                   ELSE pg_catalog.format('%s rows of counted runs folded', v_folded) END;
    RETURN NEXT;
    -- Last, because its lock on the hot table lasts until this transaction ends.
    task := 'compact';
    count := 0;
    SELECT d.due, d.detail INTO v_due, detail FROM queue._compaction_due() d;
    IF v_due AND pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        -- compact() would rewrite the table from this transaction's old snapshot.
        detail := pg_catalog.format('due, but this transaction is %s; compact() runs only READ COMMITTED',
                                    pg_catalog.upper(pg_catalog.current_setting('transaction_isolation')));
    ELSIF v_due AND v_rotated THEN
        -- The rotation's lock on queue.history lasts until this transaction ends: finishes would
        -- wait behind it through compaction's own wait for vacuum's lock.
        detail := 'due, but this call rotated history partitions; compacting at the next call';
    ELSIF v_due THEN
        IF pg_catalog.pg_try_advisory_xact_lock(v_compact_key) THEN
            -- Vacuum's own lock first, waited for past deadlock_timeout, when PostgreSQL cancels a
            -- blocking autovacuum; takes and finishes (ROW EXCLUSIVE) do not queue behind it.
            v_lock_timeout := pg_catalog.current_setting('lock_timeout');
            BEGIN
                PERFORM pg_catalog.set_config('lock_timeout',
                            (pg_catalog.date_part('epoch', pg_catalog.current_setting('deadlock_timeout')::interval) * 1000
                             + 1000)::bigint::text, true);
                LOCK TABLE queue.live_tasks IN SHARE UPDATE EXCLUSIVE MODE;
                v_unvacuumed := true;
            EXCEPTION WHEN lock_not_available THEN
                v_unvacuumed := false;
            END;
            PERFORM pg_catalog.set_config('lock_timeout', v_lock_timeout, true);
        END IF;
        IF v_unvacuumed IS NULL THEN
            detail := 'due, but another session is compacting';
        ELSIF NOT v_unvacuumed THEN
            detail := 'due, but a manual VACUUM or ANALYZE (or an autovacuum against wraparound, or DDL) holds queue.live_tasks; this session tries again at its next call';
        ELSE
            BEGIN
                SELECT c.tasks::integer, c.bytes_before, c.bytes_after INTO count, v_before, v_after FROM queue.compact() c;
                detail := pg_catalog.format('rewrote %s live tasks: %s before, %s after', count,
                              pg_catalog.pg_size_pretty(v_before), pg_catalog.pg_size_pretty(v_after));
            EXCEPTION WHEN lock_not_available THEN
                -- Waiting for the lock stalls takes behind it: do not try again at once.
                PERFORM pg_catalog.set_config('skiplock.compact_retry_at',
                            (pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) + 60)::text, false);
                count := 0;
                detail := 'due, but queue.live_tasks was busy (compact() timed out on its lock); this session tries again in 60 s';
            END;
        END IF;
    END IF;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION queue.maintain(timestamptz) IS 'Housekeeping, each step only when due: reaps hung tasks, fires cron schedules, rolls up closed hours, rotates history, forgets stale waiting marks, compacts queue.live_tasks (ACCESS EXCLUSIVE until commit). A row per step. Cheap every second.';
REVOKE ALL ON FUNCTION queue.maintain(timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.maintain(timestamptz) TO skiplock_admin;
