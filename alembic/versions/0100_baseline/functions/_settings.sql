-- _settings(stage): the policy row of a stage, or the defaults row '*' when it has none.
CREATE OR REPLACE FUNCTION queue._settings(stage text)
    RETURNS queue.stage_settings
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_settings queue.stage_settings;
BEGIN
    SELECT s.* INTO v_settings
      FROM queue.stage_settings s
     WHERE s.stage IN (_settings.stage, '*')
     ORDER BY s.stage = '*'
     LIMIT 1;
    RETURN v_settings;
END
$$;
COMMENT ON FUNCTION queue._settings(text) IS 'Internal: the stage_settings row of a stage, or the ''*'' defaults row. Invoker rights: only skiplock''s own functions call it.';
REVOKE ALL ON FUNCTION queue._settings(text) FROM PUBLIC;
