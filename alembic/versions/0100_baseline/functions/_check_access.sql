-- _check_access(stage, what): raises 42501 unless the caller may `what` ('enqueue' or 'take')
-- on a restricted stage: a member of a role listed for it in queue.stage_access with that right,
-- or of skiplock_admin. Callers test stage_settings.restricted first, so open stages never get here.
CREATE OR REPLACE FUNCTION queue._check_access(stage text, what text)
    RETURNS void
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_caller name := queue._caller();
BEGIN
    IF pg_catalog.pg_has_role(v_caller, 'skiplock_admin', 'MEMBER')
       OR EXISTS (SELECT 1
                    FROM queue.stage_access a
                   WHERE a.stage = _check_access.stage
                     AND CASE _check_access.what WHEN 'take' THEN a.may_take ELSE a.may_enqueue END
                     AND pg_catalog.pg_has_role(v_caller, a.role::oid, 'MEMBER')) THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'permission denied for stage %', _check_access.stage
        USING ERRCODE = '42501',
              DETAIL = pg_catalog.format('Stage %s is restricted and role %s has no %s right on it.',
                                         pg_catalog.quote_literal(_check_access.stage), pg_catalog.quote_ident(v_caller), _check_access.what),
              -- grant_stage takes a regrole, whose input is an identifier: "Worker" stays Worker.
              HINT = pg_catalog.format('An admin can allow it: SELECT queue.grant_stage(%s, %s);',
                                       pg_catalog.quote_literal(_check_access.stage),
                                       pg_catalog.quote_literal(pg_catalog.quote_ident(v_caller)));
END
$$;
COMMENT ON FUNCTION queue._check_access(text, text) IS 'Internal: raises 42501 unless the calling role (queue._caller()) may enqueue into / take from a restricted stage: listed in queue.stage_access with that right, or a member of skiplock_admin.';
REVOKE ALL ON FUNCTION queue._check_access(text, text) FROM PUBLIC;
