-- _claim_hint(c, v_rescan_at, stage): records in the session setting skiplock.claim_hint where the
-- next claim in the stage starts: after task c (its priority, run_at and id), until v_rescan_at
-- (microseconds since the epoch, as text). The text is '<priority>/<run_at in microseconds since
-- the epoch>/<id>/<rescan_at>/<stage>', the stage last as it may hold '/'; a task due at
-- +-infinity leaves '' (no position). Its <claim hint> block is the definition: take_next and
-- take_locked carry the same text inline in their claim (tests/py/test_one_way.py keeps them
-- equal); _claim_position reads it back. Returns the text; writes only the setting.
CREATE OR REPLACE FUNCTION queue._claim_hint(c queue.live_tasks, v_rescan_at text, stage text)
    RETURNS text
    LANGUAGE sql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT
              -- <claim hint> (the definition: take_next and take_locked carry the same text)
              pg_catalog.set_config('skiplock.claim_hint',
                  CASE WHEN pg_catalog.isfinite(c.run_at)
                       THEN pg_catalog.concat_ws('/', c.priority, (EXTRACT(epoch FROM c.run_at) * 1000000)::bigint,
                                                 c.id, v_rescan_at, _claim_hint.stage)
                       ELSE '' END,
                  false)
              -- </claim hint>
$$;
COMMENT ON FUNCTION queue._claim_hint(queue.live_tasks, text, text) IS 'Internal: records in skiplock.claim_hint that the next claim in the stage starts after task c. The definition of the claim position''s text that take_next and take_locked carry inline.';
REVOKE ALL ON FUNCTION queue._claim_hint(queue.live_tasks, text, text) FROM PUBLIC;
