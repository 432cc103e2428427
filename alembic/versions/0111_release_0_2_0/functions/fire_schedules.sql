-- fire_schedules(now): enqueue one task for every schedule that is due (next_fire <= now); returns
-- how many tasks it enqueued. queue.maintain() calls it; `now` can be injected for tests.
-- Missed ticks are skipped, not burst: a schedule fires once per call, for its latest due tick
-- (last_fired), and next_fire moves to its first tick after now. Exactly once per tick with many
-- callers: due schedules are locked FOR UPDATE SKIP LOCKED and checked again once locked, the task
-- and the new next_fire commit together, and the task's key 'schedule:<name>:<tick in UTC>' keeps
-- a tick whose task is still live from being enqueued again. A schedule with overlap false skips a
-- tick (next_fire moves on, last_fired stays) while the task it last enqueued is live.
-- Call it in READ COMMITTED: under REPEATABLE READ a schedule another session fired since the
-- snapshot raises 40001. Raises 22004 for a NULL now, 22023 for an infinite one.
-- Locks the due rows of queue.schedules until commit. Writes queue.schedules (next_fire,
-- last_fired, last_task) and queue.live_tasks (through queue.enqueue, which also sends NOTIFY).
CREATE OR REPLACE FUNCTION queue.fire_schedules(now timestamptz DEFAULT pg_catalog.now())
    RETURNS integer
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_s     queue.schedules;
    v_tick  timestamptz;
    v_next  timestamptz;
    v_hi    timestamptz;
    v_mid   timestamptz;
    v_try   timestamptz;
    v_key   text;
    v_id    bigint;
    v_count integer := 0;
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN fire_schedules.now IS NULL OR NOT pg_catalog.isfinite(fire_schedules.now) THEN 'now' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('fire_schedules', v_bad, pg_catalog.jsonb_build_object(
            'now', fire_schedules.now::text));
    END IF;
    -- </arguments>

    FOR v_s IN
        SELECT s.*
          FROM queue.schedules s
         WHERE s.next_fire <= fire_schedules.now
         ORDER BY s.next_fire, s.name
           FOR UPDATE SKIP LOCKED
    LOOP
        -- Under READ COMMITTED PostgreSQL already re-evaluated the WHERE on the row as locked; the
        -- guard must not rest on that alone.
        CONTINUE WHEN v_s.next_fire > fire_schedules.now;

        -- The latest due tick. Usually next_fire itself; after an outage, halve the span of missed
        -- ticks instead of walking each one. Invariant: v_tick is due and no tick lies in (v_hi, now].
        v_tick := v_s.next_fire;
        v_hi := fire_schedules.now;
        LOOP
            v_next := queue._cron_next(v_s.cron, v_tick, v_s.timezone);
            EXIT WHEN v_next > fire_schedules.now;
            v_mid := pg_catalog.to_timestamp((pg_catalog.date_part('epoch', v_next) + pg_catalog.date_part('epoch', v_hi)) / 2);
            v_try := queue._cron_next(v_s.cron, v_mid, v_s.timezone);
            IF v_try <= fire_schedules.now THEN
                v_tick := v_try;
            ELSE
                v_tick := v_next;
                v_hi := v_mid;
            END IF;
        END LOOP;

        IF NOT v_s.overlap
           AND EXISTS (SELECT 1 FROM queue.live_tasks t WHERE t.id = v_s.last_task) THEN
            UPDATE queue.schedules s
               SET next_fire = v_next
             WHERE s.name = v_s.name;
            CONTINUE;
        END IF;
        v_key := 'schedule:' || v_s.name || ':'
                 || pg_catalog.to_char(v_tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"');
        IF NOT EXISTS (SELECT FROM queue.live_tasks t WHERE t.stage = v_s.stage AND t.key = v_key) THEN
            v_id := queue.enqueue(payload => v_s.payload, stage => v_s.stage, priority => v_s.priority,
                                  key => v_key);
            v_count := v_count + 1;
        END IF;
        UPDATE queue.schedules s
           SET next_fire = v_next, last_fired = v_tick, last_task = coalesce(v_id, s.last_task)
         WHERE s.name = v_s.name;
        v_id := NULL;
    END LOOP;
    RETURN v_count;
END
$$;
COMMENT ON FUNCTION queue.fire_schedules(timestamptz) IS 'Enqueues one task for each schedule due at now, for its latest due tick (missed ticks and, without overlap, ticks while the last task is live are skipped); moves next_fire past now. Once per tick (SKIP LOCKED, key per tick). Returns the count.';
REVOKE ALL ON FUNCTION queue.fire_schedules(timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.fire_schedules(timestamptz) TO skiplock_admin;
