-- run_schedule_now(name): enqueue the schedule's task (its payload, stage and priority) now, without
-- moving its timetable: next_fire and last_fired stay, and the next tick fires as planned. The task
-- gets the key 'schedule:<name>:now:<now() in UTC>', so a second call in the same transaction
-- returns the same task. With overlap false, while the task the schedule last enqueued is live,
-- it enqueues nothing and returns NULL; otherwise it returns the new task's id, which becomes the
-- schedule's last_task (a schedule without overlap then skips ticks while it is live).
-- Raises 22004 for a NULL name, P0002 for a name no schedule has, and what enqueue raises (42501
-- for a restricted stage). Locks the schedule's row until commit (a concurrent fire_schedules skips
-- it this round); writes queue.schedules (last_task) and queue.live_tasks (through enqueue).
CREATE OR REPLACE FUNCTION queue.run_schedule_now(name text)
    RETURNS bigint
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_s  queue.schedules;
    v_id bigint;
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN run_schedule_now.name IS NULL THEN 'name' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('run_schedule_now', v_bad, pg_catalog.jsonb_build_object(
            'name', run_schedule_now.name));
    END IF;
    -- </arguments>
    SELECT s.* INTO v_s
      FROM queue.schedules s
     WHERE s.name = run_schedule_now.name
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no such schedule'
            USING ERRCODE = 'P0002',
                  DETAIL = pg_catalog.format('No schedule is named %s.',
                                             pg_catalog.quote_literal(pg_catalog.left(run_schedule_now.name, 200))),
                  HINT = 'SELECT name FROM queue.schedules lists them; queue.schedule() creates one.';
    END IF;
    IF NOT v_s.overlap AND EXISTS (SELECT 1 FROM queue.live_tasks t WHERE t.id = v_s.last_task) THEN
        RETURN NULL;
    END IF;
    v_id := queue.enqueue(payload => v_s.payload, stage => v_s.stage, priority => v_s.priority,
                          key => 'schedule:' || v_s.name || ':now:'
                                 || pg_catalog.to_char(pg_catalog.now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'));
    UPDATE queue.schedules s
       SET last_task = v_id
     WHERE s.name = v_s.name;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION queue.run_schedule_now(text) IS 'Enqueues the named schedule''s task now without moving its timetable and returns its id; NULL (nothing enqueued) when the schedule has overlap false and its last task is still live. P0002 for an unknown name.';
REVOKE ALL ON FUNCTION queue.run_schedule_now(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.run_schedule_now(text) TO skiplock_admin;
