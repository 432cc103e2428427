-- _check_stages(stages): raises unless stages is a usable set of stages for a multi-stage take
-- (take_next, take_locked, consume with text[]): 1 to 1000 elements, each a stage name or a
-- prefix ending in '*' ('tenant.*': every stage starting 'tenant.'; not '*' alone, which would
-- take from every stage of the database).
-- Raises 22004 for a NULL array or element, 22023 for an empty or too long array, a bad name or
-- a prefix of more than 53 bytes. Reads and writes nothing.
CREATE OR REPLACE FUNCTION queue._check_stages(stages text[])
    RETURNS void
    LANGUAGE plpgsql
    IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_stage text;
BEGIN
    IF _check_stages.stages IS NULL THEN
        RAISE EXCEPTION 'stages must not be NULL'
            USING ERRCODE = '22004', DETAIL = 'stages is NULL.',
                  HINT = 'Pass an array of stage names or prefixes, e.g. ARRAY[''mail'', ''tenant.*''].';
    END IF;
    IF pg_catalog.cardinality(_check_stages.stages) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'stages must hold 1 to 1000 elements'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('stages has %s elements.', pg_catalog.cardinality(_check_stages.stages)),
                  HINT = 'Name at most 1000 stages; a prefix such as ''tenant.*'' covers any number of them.';
    END IF;
    FOREACH v_stage IN ARRAY _check_stages.stages LOOP
        IF pg_catalog.right(v_stage, 1) = '*' AND v_stage <> '*' THEN
            IF pg_catalog.octet_length(v_stage) > 54 THEN
                PERFORM queue._check_stage(v_stage, 'stages prefix');
            END IF;
        ELSE
            PERFORM queue._check_stage(v_stage, 'stages element');
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION queue._check_stages(text[]) IS 'Internal: raises 22004/22023 unless stages holds 1 to 1000 stage names or prefixes ending in ''*'', for the multi-stage takes.';
REVOKE ALL ON FUNCTION queue._check_stages(text[]) FROM PUBLIC;
