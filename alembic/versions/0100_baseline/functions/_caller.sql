-- _caller(): the role the application acts as, seen from inside a SECURITY DEFINER function.
-- There current_user is the owner (skiplock_owner); the caller is the role set with SET ROLE
-- (the GUC 'role', which SECURITY DEFINER does not change), else the session's login role.
CREATE OR REPLACE FUNCTION queue._caller()
    RETURNS name
    LANGUAGE sql
    STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(NULLIF(pg_catalog.current_setting('role'), 'none'), SESSION_USER)::name
$$;
COMMENT ON FUNCTION queue._caller() IS 'Internal: the calling role (SET ROLE, else the session user), which current_user hides inside SECURITY DEFINER functions; used by the per-stage access checks.';
REVOKE ALL ON FUNCTION queue._caller() FROM PUBLIC;
