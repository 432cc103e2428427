-- grant_stage(stage, role, enqueue, take): restrict a stage to the roles granted on it and let
-- members of `role` enqueue into it (enqueue) and/or take from it (take). The first grant on a
-- stage makes it restricted: from then on only the roles listed in queue.stage_access (and members
-- of skiplock_admin) may enqueue into it or take from it; everyone else gets 42501.
-- Granting again replaces the role's two rights. A stage without a stage_settings row gets one,
-- copied from the defaults row '*' (as configure_stage does), with restricted = true.
-- Raises 22004 for a NULL argument, 22023 for a bad stage name.
-- Locks the stage's stage_settings row (grants and revokes on one stage run one at a time).
-- Writes queue.stage_settings and queue.stage_access.
CREATE OR REPLACE FUNCTION queue.grant_stage(
        stage   text,
        role    regrole,
        enqueue boolean DEFAULT true,
        take    boolean DEFAULT true)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row queue.stage_settings;
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN grant_stage.stage IS NULL OR grant_stage.stage IN ('', '*') OR pg_catalog.octet_length(grant_stage.stage) > 54 THEN 'stage'
                  WHEN grant_stage.role IS NULL THEN 'role'
                  WHEN grant_stage.enqueue IS NULL OR grant_stage.take IS NULL THEN 'enqueue, take' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('grant_stage', v_bad, pg_catalog.jsonb_build_object(
            'stage', grant_stage.stage, 'role', grant_stage.role::text, 'enqueue', grant_stage.enqueue::text,
            'take', grant_stage.take::text));
    END IF;
    -- </arguments>

    v_row := queue._settings(grant_stage.stage);
    v_row.stage      := grant_stage.stage;
    v_row.restricted := true;
    v_row.updated    := pg_catalog.now();
    INSERT INTO queue.stage_settings AS s
    VALUES (v_row.*)
    ON CONFLICT ON CONSTRAINT stage_settings_pkey DO UPDATE
       SET restricted = true, updated = excluded.updated;

    INSERT INTO queue.stage_access AS a (stage, role, may_enqueue, may_take)
    VALUES (grant_stage.stage, grant_stage.role, grant_stage.enqueue, grant_stage.take)
    ON CONFLICT ON CONSTRAINT stage_access_pkey DO UPDATE
       SET may_enqueue = excluded.may_enqueue, may_take = excluded.may_take;
END
$$;
COMMENT ON FUNCTION queue.grant_stage(text, regrole, boolean, boolean) IS 'Restricts a stage to the roles granted on it and lets members of role enqueue into it and/or take from it (skiplock_admin members always may). Raises 22004/22023 for bad arguments. Writes queue.stage_access and stage_settings.restricted.';
REVOKE ALL ON FUNCTION queue.grant_stage(text, regrole, boolean, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.grant_stage(text, regrole, boolean, boolean) TO skiplock_admin;
