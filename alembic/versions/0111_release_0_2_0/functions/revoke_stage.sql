-- revoke_stage(stage, role): remove a role's rights on a stage; returns whether it had any.
-- When the last role goes, the stage is open again (stage_settings.restricted = false): anyone
-- with skiplock_producer / skiplock_worker may use it, as before the first grant_stage.
-- Raises 22004 for a NULL argument, 22023 for a bad stage name.
-- Locks the stage's stage_settings row (grants and revokes on one stage run one at a time).
-- Writes queue.stage_access and queue.stage_settings.
CREATE OR REPLACE FUNCTION queue.revoke_stage(
        stage text,
        role  regrole)
    RETURNS boolean
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_found boolean;
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN revoke_stage.stage IS NULL OR revoke_stage.stage IN ('', '*') OR pg_catalog.octet_length(revoke_stage.stage) > 54 THEN 'stage'
                  WHEN revoke_stage.role IS NULL THEN 'role' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('revoke_stage', v_bad, pg_catalog.jsonb_build_object(
            'stage', revoke_stage.stage, 'role', revoke_stage.role::text));
    END IF;
    -- </arguments>
    PERFORM 1 FROM queue.stage_settings s WHERE s.stage = revoke_stage.stage FOR UPDATE;

    DELETE FROM queue.stage_access a
     WHERE a.stage = revoke_stage.stage AND a.role = revoke_stage.role;
    v_found := FOUND;
    IF v_found AND NOT EXISTS (SELECT 1 FROM queue.stage_access a WHERE a.stage = revoke_stage.stage) THEN
        UPDATE queue.stage_settings s
           SET restricted = false, updated = pg_catalog.now()
         WHERE s.stage = revoke_stage.stage;
    END IF;
    RETURN v_found;
END
$$;
COMMENT ON FUNCTION queue.revoke_stage(text, regrole) IS 'Removes a role''s rights on a stage and returns whether it had any; when no role is left the stage is open again. Raises 22004/22023 for bad arguments. Writes queue.stage_access and stage_settings.restricted.';
REVOKE ALL ON FUNCTION queue.revoke_stage(text, regrole) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.revoke_stage(text, regrole) TO skiplock_admin;
