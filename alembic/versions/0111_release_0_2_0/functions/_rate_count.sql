-- _rate_count(stage, group_keys, at, settings): counts tasks just claimed in a rate-limited stage
-- in queue.rate_windows: one per element of group_keys ('' for the whole stage), in the window and
-- burst part that hold `at` (a count of an older one starts again from these). For take_next and
-- _take_grouped, in the transaction of the claim and under the stage's advisory lock, so that count
-- and claim commit together. Writes queue.rate_windows (one row a group).
CREATE OR REPLACE FUNCTION queue._rate_count(
        stage      text,
        group_keys text[],
        at         timestamptz,
        settings   queue.stage_settings)
    RETURNS void
    LANGUAGE plpgsql  -- not sql: Citus cannot plan a distributed statement of a SQL function with parameters
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO queue.rate_windows AS w (stage, group_key, window_start, taken, burst_start, burst_taken)
    SELECT _rate_count.stage, g.group_key,
           queue._rate_bin(_rate_count.at, _rate_count.settings, false), g.n,
           queue._rate_bin(_rate_count.at, _rate_count.settings, true), g.n
      FROM (SELECT k.group_key, pg_catalog.count(*)::integer AS n
              FROM pg_catalog.unnest(_rate_count.group_keys) AS k(group_key)
             GROUP BY k.group_key) g
    ON CONFLICT ON CONSTRAINT rate_windows_pkey DO UPDATE
       SET taken        = CASE WHEN w.window_start = EXCLUDED.window_start THEN w.taken + EXCLUDED.taken
                               ELSE EXCLUDED.taken END,
           window_start = EXCLUDED.window_start,
           burst_taken  = CASE WHEN w.burst_start = EXCLUDED.burst_start THEN w.burst_taken + EXCLUDED.burst_taken
                               ELSE EXCLUDED.burst_taken END,
           burst_start  = EXCLUDED.burst_start;
END
$$;
COMMENT ON FUNCTION queue._rate_count(text, text[], timestamptz, queue.stage_settings) IS 'Internal, for take_next and _take_grouped: adds the tasks a take just claimed in a rate-limited stage (one per group_key, or '''' for the stage) to the current window''s count in queue.rate_windows.';
REVOKE ALL ON FUNCTION queue._rate_count(text, text[], timestamptz, queue.stage_settings) FROM PUBLIC;
