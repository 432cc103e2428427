-- _settings(stage): the policy row of a stage, or the defaults row '*' when it has none; the one
-- settings lookup of every function. Two primary-key probes: cheaper than one statement that sorts
-- both rows. No SET clause, so that a call costs no more than the probes (invoker rights; only
-- skiplock's own functions, which pin search_path, may call it; every name is qualified).
CREATE OR REPLACE FUNCTION queue._settings(stage text)
    RETURNS queue.stage_settings
    LANGUAGE plpgsql
    STABLE
AS $$
DECLARE
    v_settings queue.stage_settings;
BEGIN
    SELECT s.* INTO v_settings FROM queue.stage_settings s WHERE s.stage OPERATOR(pg_catalog.=) _settings.stage;
    IF NOT FOUND THEN
        SELECT s.* INTO v_settings FROM queue.stage_settings s WHERE s.stage OPERATOR(pg_catalog.=) '*';
    END IF;
    RETURN v_settings;
END
$$;
COMMENT ON FUNCTION queue._settings(text) IS 'Internal: the stage_settings row of a stage, or the ''*'' defaults row. Invoker rights: only skiplock''s own functions call it.';
REVOKE ALL ON FUNCTION queue._settings(text) FROM PUBLIC;
