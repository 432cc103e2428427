-- _take_grouped(stage, batch, group_limit, taken_at, lease_for, worker): take_next's claim for a
-- stage with a group_limit (NULL: none) or a rate_limit (per group with rate_per_group). take_next
-- calls it holding the stage's advisory lock, so no other taker of the stage counts or claims
-- meanwhile (VOLATILE: each statement sees what the lock's earlier holders committed).
-- Each pass leaves the groups at their cap out of the candidates and claims, in claim order
-- (priority, run_at, id), those whose group still has room: a group's k-th candidate fits when its
-- running tasks + k <= group_limit and k <= what its rate window has left (_rate_left). Tasks
-- without a group_key count only against max_running and a stage-wide rate_limit (take_next caps
-- batch by it; the claimed tasks count in queue.rate_windows, per group or for the stage). A
-- candidate another transaction holds is skipped (SKIP LOCKED) and its group sits out the rest of
-- the take, so that its next task does not overtake it. The next pass starts after this pass's
-- last candidate; a take reads at most batch + 1,000 candidates. A group whose running task ends
-- during the take waits for the next take. Locks the claimed rows; writes queue.live_tasks (and
-- queue.rate_windows).
CREATE OR REPLACE FUNCTION queue._take_grouped(
        stage       text,
        batch       integer,
        group_limit integer,
        taken_at    timestamptz,
        lease_for   interval,
        worker      text)
    RETURNS TABLE (id bigint, payload jsonb, attempt integer, lease uuid, lease_expires timestamptz,
                   priority integer, key text)
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_left   integer := _take_grouped.batch;
    v_capped text[];
    v_ids    bigint[];
    v_groups text[];
    v_taken  integer;
    v_fits   bigint[];
    v_rows   queue.live_tasks[];
    v_read   integer := 0;
    v_held   text[] := '{}'::text[];
    v_prios  integer[];
    v_runs   timestamptz[];
    v_asked  integer;
    -- Where the next pass starts: after the last candidate of this one, in claim order. Every
    -- task before it was taken, is in a group now at its cap, or is held by another transaction.
    v_after_priority integer     := -2147483648;
    v_after_run_at   timestamptz := '-infinity'::timestamptz;
    v_after_id       bigint      := -9223372036854775808;
    -- A rate_limit: counted after each pass, per group (rate_per_group) or for the stage.
    v_settings       queue.stage_settings := queue._settings(_take_grouped.stage);
    v_rate_groups    boolean := v_settings.rate_limit IS NOT NULL AND v_settings.rate_per_group;
    -- One random value per call, a distinct lease per task from it: Citus refuses VOLATILE calls in an UPDATE.
    v_lease_seed     text := pg_catalog.gen_random_uuid()::text;
BEGIN
    WHILE v_left > 0 AND v_read < _take_grouped.batch + 1000 LOOP
        v_capped := v_held || ARRAY(SELECT r.group_key
                            FROM queue.live_tasks r
                           WHERE _take_grouped.group_limit IS NOT NULL
                             AND r.stage = _take_grouped.stage AND r.status = 'running'
                             AND r.group_key IS NOT NULL
                           GROUP BY r.group_key
                          HAVING pg_catalog.count(*) >= _take_grouped.group_limit)
                           || ARRAY(SELECT w.group_key
                            FROM queue.rate_windows w
                           WHERE v_rate_groups AND w.stage = _take_grouped.stage AND w.group_key <> ''
                             AND queue._rate_left(_take_grouped.stage, w.group_key, _take_grouped.taken_at, v_settings) < 1);
        -- The next candidates in claim order, groups at their cap left out.
        SELECT pg_catalog.array_agg(c.id ORDER BY c.priority, c.run_at, c.id),
               pg_catalog.array_agg(c.group_key ORDER BY c.priority, c.run_at, c.id),
               pg_catalog.array_agg(c.priority ORDER BY c.priority, c.run_at, c.id),
               pg_catalog.array_agg(c.run_at ORDER BY c.priority, c.run_at, c.id)
          INTO v_ids, v_groups, v_prios, v_runs
          FROM (SELECT l.id, l.group_key, l.priority, l.run_at
                  FROM queue.live_tasks l
                 WHERE l.stage = _take_grouped.stage
                   AND l.status IN ('ready', 'error')
                   AND l.run_as IS NULL  -- SQL tasks are run_sql_tasks', run in their role's sessions
                   AND l.run_at <= _take_grouped.taken_at
                   AND (l.group_key IS NULL OR l.group_key <> ALL (v_capped))
                   AND (l.priority, l.run_at, l.id) > (v_after_priority, v_after_run_at, v_after_id)
                 ORDER BY l.priority, l.run_at, l.id
                 LIMIT v_left) c;
        EXIT WHEN v_ids IS NULL;
        v_asked := v_left;
        v_read := v_read + pg_catalog.cardinality(v_ids);
        v_after_priority := v_prios[pg_catalog.cardinality(v_ids)];
        v_after_run_at := v_runs[pg_catalog.cardinality(v_ids)];
        v_after_id := v_ids[pg_catalog.cardinality(v_ids)];

        -- Of them, those whose group has room: the k-th candidate of a group fits when the
        -- group's running tasks + k <= group_limit.
        v_fits := ARRAY(
            SELECT n.id
              FROM (SELECT p.id, p.group_key,
                           pg_catalog.row_number() OVER (PARTITION BY p.group_key ORDER BY p.ord) AS k
                      FROM ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_groups))
                           WITH ORDINALITY AS p(id, group_key, ord)) n
             WHERE n.group_key IS NULL
                OR ((_take_grouped.group_limit IS NULL
                     OR n.k + (SELECT pg_catalog.count(*)
                                 FROM queue.live_tasks r
                                WHERE r.stage = _take_grouped.stage AND r.status = 'running'
                                  AND r.group_key = n.group_key) <= _take_grouped.group_limit)
                    AND (NOT v_rate_groups
                         OR n.k <= queue._rate_left(_take_grouped.stage, n.group_key, _take_grouped.taken_at, v_settings))));
        WITH picked AS (
            SELECT l.id
              FROM queue.live_tasks l
             WHERE l.id = ANY (v_fits)
               AND l.stage = _take_grouped.stage
               AND l.status IN ('ready', 'error')
               AND l.run_as IS NULL
               AND l.run_at <= _take_grouped.taken_at
               FOR UPDATE SKIP LOCKED
        ), claimed AS (
            UPDATE queue.live_tasks t
               SET status        = 'running',
                   attempt       = t.attempt + 1,
                   lease         = pg_catalog.md5(v_lease_seed || t.id::text)::uuid,
                   lease_expires = _take_grouped.taken_at + _take_grouped.lease_for,
                   started       = _take_grouped.taken_at,
                   updated       = _take_grouped.taken_at,
                   worker        = _take_grouped.worker
              FROM picked
             WHERE t.stage = _take_grouped.stage AND t.id = picked.id  -- the stage: Citus routes by it
            RETURNING t AS task
        )
        SELECT pg_catalog.array_agg(c.task ORDER BY (c.task).priority, (c.task).run_at, (c.task).id)
          INTO v_rows FROM claimed c;
        v_taken := coalesce(pg_catalog.cardinality(v_rows), 0);
        IF v_taken > 0 AND v_settings.rate_limit IS NOT NULL THEN
            PERFORM queue._rate_count(_take_grouped.stage,
                                      CASE WHEN v_rate_groups
                                           THEN ARRAY(SELECT r.group_key FROM pg_catalog.unnest(v_rows) r WHERE r.group_key IS NOT NULL)
                                           ELSE pg_catalog.array_fill(''::text, ARRAY[v_taken]) END,
                                      _take_grouped.taken_at, v_settings);
        END IF;
        RETURN QUERY
        SELECT r.id, r.payload, r.attempt, r.lease, r.lease_expires, r.priority, r.key
          FROM pg_catalog.unnest(v_rows) r
         ORDER BY r.priority, r.run_at, r.id;
        v_left := v_left - v_taken;
        -- A group whose fitting task another transaction holds waits for it: taking its next
        -- task would break the group's order (group_limit 1: one at a time, first in first out).
        IF v_taken < pg_catalog.cardinality(v_fits) THEN
            v_held := v_held || ARRAY(
                SELECT DISTINCT g.group_key
                  FROM ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_groups)) AS g(id, group_key)
                 WHERE g.group_key IS NOT NULL AND g.id = ANY (v_fits)
                   AND g.id <> ALL (ARRAY(SELECT r.id FROM pg_catalog.unnest(v_rows) r)));
        END IF;
        -- The candidates ran out before the batch did: a further pass would find none.
        EXIT WHEN pg_catalog.cardinality(v_ids) < v_asked;
    END LOOP;
END
$$;
COMMENT ON FUNCTION queue._take_grouped(text, integer, integer, timestamptz, interval, text) IS 'Internal: take_next''s claim in a stage with a group_limit or a rate_limit (called under the stage''s advisory lock): up to batch due tasks in claim order, skipping groups at their cap without waiting on them.';
REVOKE ALL ON FUNCTION queue._take_grouped(text, integer, integer, timestamptz, interval, text) FROM PUBLIC;
