-- _rate_left(stage, group_key, at, settings): how many more tasks of a rate-limited stage (of one
-- of its groups with rate_per_group; group_key '' for the whole stage) may be taken at time `at`:
-- rate_limit less what queue.rate_windows counted in at's window, and no more than rate_burst less
-- what it counted in at's burst part. A count of an older window is empty; one of a later window
-- (a taker whose clock went back) leaves 0. For take_next and _take_grouped, which call it holding
-- the stage's advisory lock, in statements that start after it (so it sees what the lock's earlier
-- holders committed).
-- Reads queue.rate_windows; writes nothing.
CREATE OR REPLACE FUNCTION queue._rate_left(
        stage     text,
        group_key text,
        at        timestamptz,
        settings  queue.stage_settings)
    RETURNS integer
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_window timestamptz := queue._rate_bin(_rate_left.at, _rate_left.settings, false);
    v_burst  timestamptz := queue._rate_bin(_rate_left.at, _rate_left.settings, true);
    v_count  queue.rate_windows;
BEGIN
    SELECT w.* INTO v_count
      FROM queue.rate_windows w
     WHERE w.stage = _rate_left.stage AND w.group_key = _rate_left.group_key;
    IF v_count.window_start > v_window OR v_count.burst_start > v_burst THEN
        RETURN 0;
    END IF;
    RETURN greatest(0, least(
        _rate_left.settings.rate_limit
          - CASE WHEN v_count.window_start = v_window THEN v_count.taken ELSE 0 END,
        coalesce(_rate_left.settings.rate_burst, _rate_left.settings.rate_limit)
          - CASE WHEN v_count.burst_start = v_burst THEN v_count.burst_taken ELSE 0 END));
END
$$;
COMMENT ON FUNCTION queue._rate_left(text, text, timestamptz, queue.stage_settings) IS 'Internal, for take_next and _take_grouped (under the stage''s advisory lock): how many more tasks of a rate-limited stage, or of one of its groups, its window and burst let a take claim now.';
REVOKE ALL ON FUNCTION queue._rate_left(text, text, timestamptz, queue.stage_settings) FROM PUBLIC;
