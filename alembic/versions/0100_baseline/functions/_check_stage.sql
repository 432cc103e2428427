-- _check_stage(stage, argument): raises 22023/22004 unless stage is a usable stage name.
CREATE OR REPLACE FUNCTION queue._check_stage(stage text, argument text DEFAULT 'stage')
    RETURNS void
    LANGUAGE plpgsql
    IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF stage IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', argument
            USING ERRCODE = '22004', DETAIL = pg_catalog.format('%s is NULL.', argument),
                  HINT = 'Pass a stage name such as ''default''.';
    END IF;
    IF stage = '' OR stage = '*' OR pg_catalog.octet_length(stage) > 54 THEN
        RAISE EXCEPTION 'invalid % name', argument
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('%s is %s (%s bytes).', argument, pg_catalog.quote_literal(pg_catalog.left(stage, 80)), pg_catalog.octet_length(stage)),
                  HINT = 'A stage name is 1 to 54 bytes and not ''*'' (the name of the defaults row).';
    END IF;
END
$$;
COMMENT ON FUNCTION queue._check_stage(text, text) IS 'Internal: raises 22004 for a NULL stage, 22023 for an empty, ''*'' or longer than 54 bytes one (the NOTIFY channel skiplock.<stage> must fit in 63 bytes).';
REVOKE ALL ON FUNCTION queue._check_stage(text, text) FROM PUBLIC;
