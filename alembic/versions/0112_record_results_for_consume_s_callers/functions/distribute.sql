-- distribute(): spread skiplock over a Citus cluster (run on the coordinator, as a superuser, after
-- every upgrade). The hot table, the history, the waiter marks and the rate windows are distributed
-- by stage in one colocation group; the small tables become reference tables; the worker-side calls are
-- registered for delegation by their stage argument, forced for the worker calls but finish (inside
-- a transaction too: a take's per-stage lock and a task's row locks stay on one node). Functions
-- that plan generically on one server plan per call here (Citus cannot route a generic plan).
-- A stage left out defaults to '' (a NULL one crashes Citus's coordinator). skiplock_owner gets
-- LOGIN: Citus reaches the workers as the current user, which inside a
-- SECURITY DEFINER call is skiplock_owner. Idempotent: returns one row per change it made.
-- Raises 0A000 when the citus extension is absent. Citus calls go through EXECUTE format() (absent
-- on plain PostgreSQL: plpgsql_check checks no such string). Takes Citus's locks on each table it distributes.
CREATE OR REPLACE FUNCTION queue.distribute()
    RETURNS SETOF text
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_table   text;
    v_done    boolean;
    v_call    record;
    v_current text;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension e WHERE e.extname = 'citus') THEN
        RAISE EXCEPTION 'citus is not installed in this database'
            USING ERRCODE = '0A000',
                  DETAIL = 'skiplock distribute spreads schema queue over a Citus cluster; without Citus there is nothing to distribute.',
                  HINT = 'On a Citus coordinator: CREATE EXTENSION citus, add the workers (citus_add_node), then run it again. One server needs no distribute.';
    END IF;
    -- One connection per node for the whole run: Citus propagates function DDL only over those.
    PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
    -- The tables: the hot table's group first, the small ones copied to every node.
    FOREACH v_table IN ARRAY ARRAY['live_tasks', 'history', 'stage_waiters', 'rate_windows', 'finished_dropped',
                                   'finished_counts', 'finished_hours', 'stage_settings', 'stage_access', 'history_policy',
                                   'schedules', 'fence_key', 'reaper_clock', 'finished_hours_clock', 'dependencies']
    LOOP
        EXECUTE pg_catalog.format('SELECT EXISTS (SELECT FROM pg_catalog.%I p WHERE p.logicalrelid = $1)', 'pg_dist_partition')
           INTO v_done USING pg_catalog.format('queue.%I', v_table)::regclass;
        CONTINUE WHEN v_done;
        IF v_table IN ('live_tasks', 'history', 'stage_waiters', 'rate_windows', 'finished_dropped', 'finished_counts',
                       'finished_hours') THEN
            EXECUTE pg_catalog.format('SELECT pg_catalog.%I($1, %L, colocate_with => $2)', 'create_distributed_table', 'stage')
              USING pg_catalog.format('queue.%I', v_table)::regclass,
                    CASE WHEN v_table = 'live_tasks' THEN 'none' ELSE 'queue.live_tasks' END;
            RETURN NEXT pg_catalog.format('distributed queue.%I by stage', v_table);
        ELSE
            EXECUTE pg_catalog.format('SELECT pg_catalog.%I($1)', 'create_reference_table') USING pg_catalog.format('queue.%I', v_table)::regclass;
            RETURN NEXT pg_catalog.format('made queue.%I a reference table', v_table);
        END IF;
        -- The rows now live in the shards; the coordinator's copy is only dead weight.
        EXECUTE pg_catalog.format('SELECT pg_catalog.%I($1)', 'truncate_local_data_after_distributing_table')
          USING pg_catalog.format('queue.%I', v_table)::regclass;
    END LOOP;
    -- Citus cannot route a statement of a generic plan: those functions plan per call here.
    FOR v_call IN
        SELECT p.oid::regprocedure AS fn
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'queue'::regnamespace
           AND 'plan_cache_mode=force_generic_plan' = ANY (p.proconfig)
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s RESET plan_cache_mode', v_call.fn);
        RETURN NEXT pg_catalog.format('%s plans each call', v_call.fn);
    END LOOP;
    -- Every function exists on every node (delegated calls call the helpers there).
    FOR v_call IN
        SELECT p.oid::regprocedure AS fn
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'queue'::regnamespace AND p.prokind = 'f'
    LOOP
        EXECUTE pg_catalog.format('SELECT EXISTS (SELECT FROM pg_catalog.%I o WHERE o.classid = %L::regclass AND o.objid = $1)',
                                  'pg_dist_object', 'pg_catalog.pg_proc')
           INTO v_done USING v_call.fn::oid;
        IF NOT v_done THEN
            EXECUTE pg_catalog.format('SELECT pg_catalog.%I($1)', 'create_distributed_function') USING v_call.fn;
        END IF;
    END LOOP;
    -- The calls that run on the node of their stage's shard.
    FOR v_call IN
        SELECT f.fn::regprocedure AS fn, f.force,
               pg_catalog.array_position(p.proargnames, 'stage') - 1 AS arg
          FROM (VALUES ('queue.enqueue(jsonb,text,integer,timestamptz,text,text,interval,boolean,text,bigint[],text)', false),
                       ('queue.enqueue_batch(jsonb[],text,integer,timestamptz,text)', false),
                       ('queue.take_next(text,integer,interval,text)', true),
                       ('queue.take_locked(text,integer)', true),
                       ('queue.consume(text,integer)', true),
                       -- beside consume, in the same transaction on the same node: its rows' xmin is that node's
                       ('queue.record_results(text,bigint[],jsonb[])', true),
                       ('queue.drain(text,integer)', true),
                       ('queue.finish_and_take(bigint,uuid,text,integer,interval,text,jsonb)', true),
                       -- not forced: a move to next_stage writes another stage's shard
                       ('queue.finish(bigint,uuid,text,text,jsonb)', false),
                       ('queue.finish_batch(bigint[],uuid[],text,jsonb[])', true),
                       ('queue.fail(bigint,uuid,text,boolean,interval,text)', true),
                       ('queue.heartbeat(bigint,uuid,interval,text,jsonb)', true),
                       ('queue.release(bigint,uuid,interval,text)', true),
                       ('queue.finish_locked(bigint,text,text,jsonb)', true),
                       ('queue.fail_locked(bigint,text,boolean,interval,text,text)', true)) AS f (fn, force)
          JOIN pg_catalog.pg_proc p ON p.oid = f.fn::regprocedure
    LOOP
        EXECUTE pg_catalog.format('SELECT o.distribution_argument_index || %L || coalesce(o.force_delegation, false)
                                     FROM pg_catalog.%I o WHERE o.classid = %L::regclass AND o.objid = $1',
                                  '/', 'pg_dist_object', 'pg_catalog.pg_proc')
           INTO v_current USING v_call.fn::oid;
        CONTINUE WHEN v_current = v_call.arg || '/' || v_call.force;
        EXECUTE pg_catalog.format('SELECT pg_catalog.%I($1, $2, colocate_with => %L, force_delegation => $3)',
                                  'create_distributed_function', 'queue.live_tasks')
          USING v_call.fn, '$' || (v_call.arg + 1), v_call.force;
        RETURN NEXT pg_catalog.format('%s runs on its stage''s node%s', v_call.fn,
                                      CASE WHEN v_call.force THEN ', inside transactions too' ELSE '' END);
    END LOOP;
    -- A delegated call whose stage is NULL crashes the coordinator's backend (a Citus bug): a call
    -- that leaves the stage out gets '' instead, which no task has (the answer for another stage).
    FOR v_call IN
        SELECT p.oid::regprocedure AS fn, pg_catalog.pg_get_functiondef(p.oid) AS def
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'queue'::regnamespace  -- the delegated ones (cancel, retry: NULL is any stage)
           AND p.proname IN ('finish', 'finish_batch', 'fail', 'heartbeat', 'release', 'finish_locked', 'fail_locked')
           AND pg_catalog.strpos(pg_catalog.pg_get_function_arguments(p.oid), ', stage text DEFAULT NULL::text') > 0
    LOOP
        EXECUTE pg_catalog.replace(v_call.def, ', stage text DEFAULT NULL::text', ', stage text DEFAULT ''''::text');
        RETURN NEXT pg_catalog.format('%s: a stage left out is '''', never NULL', v_call.fn);
    END LOOP;
    IF NOT (SELECT r.rolcanlogin FROM pg_catalog.pg_roles r WHERE r.rolname = 'skiplock_owner') THEN
        ALTER ROLE skiplock_owner LOGIN;
        RETURN NEXT 'skiplock_owner may log in (Citus connects to the workers as it in SECURITY DEFINER calls)';
    END IF;
END
$$;
COMMENT ON FUNCTION queue.distribute() IS 'Citus only: distributes the hot table and history by stage, makes the small tables reference tables, and routes the worker calls to their stage''s node. Idempotent: one row per change. 0A000 without citus.';
REVOKE ALL ON FUNCTION queue.distribute() FROM PUBLIC;
