-- _settings(stage): the policy row of a stage, or the defaults row '*' when it has none; the one
-- settings lookup. Two primary-key probes, the second only when the first finds nothing. The hot
-- path (take_next, take_locked, consume, enqueue, enqueue_batch) carries the same <settings> block
-- inline, a call costing more than the lookup (tests/py/test_one_way.py keeps the texts equal).
-- No SET clause (invoker rights; only skiplock's own functions, which pin search_path, call it;
-- every name and operator is qualified).
CREATE OR REPLACE FUNCTION queue._settings(stage text)
    RETURNS queue.stage_settings
    LANGUAGE plpgsql
    STABLE
AS $$
DECLARE
    v_settings queue.stage_settings;
BEGIN
    -- <settings> (the stage's row, else the defaults '*': the same text in _settings and its inline copies)
    v_settings := coalesce((SELECT s FROM queue.stage_settings s WHERE s.stage OPERATOR(pg_catalog.=) _settings.stage),
                           (SELECT s FROM queue.stage_settings s WHERE s.stage OPERATOR(pg_catalog.=) '*'));
    -- </settings>
    RETURN v_settings;
END
$$;
COMMENT ON FUNCTION queue._settings(text) IS 'Internal: the stage_settings row of a stage, or the ''*'' defaults row. Invoker rights: only skiplock''s own functions call it.';
REVOKE ALL ON FUNCTION queue._settings(text) FROM PUBLIC;
