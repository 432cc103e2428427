-- _hidden_stages(): the restricted stages the calling role may not see, for the monitoring views:
-- each stage with rows in queue.stage_access (a restricted one; stage_settings.restricted mirrors
-- it) unless the caller (queue._caller(), as _check_access sees it) is a member of skiplock_admin
-- or of a role listed for it there (either right). The views read it once per query, as an init plan
-- `(SELECT queue._hidden_stages())`, and keep only rows whose stage is not in it; with no
-- restricted stage it is '{}' and costs them one look at the empty stage_access table. A member
-- of skiplock_admin gets '{}' without that look (on Citus a view read of one stage runs on the
-- stage's node, where a read of stage_access would be a refused nested distributed query).
-- Result: text[], never NULL. Reads stage_access; locks and writes nothing.
CREATE OR REPLACE FUNCTION queue._hidden_stages()
    RETURNS text[]
    LANGUAGE plpgsql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- PL/pgSQL rather than SQL: the session keeps its plan (a SQL function with SET is planned per query).
    IF pg_catalog.pg_has_role(queue._caller(), 'skiplock_admin', 'MEMBER') THEN
        RETURN '{}'::text[];
    END IF;
    RETURN coalesce((SELECT pg_catalog.array_agg(DISTINCT a.stage)
                       FROM queue.stage_access a
                      WHERE NOT EXISTS (SELECT FROM queue.stage_access g
                                         WHERE g.stage OPERATOR(pg_catalog.=) a.stage
                                           AND pg_catalog.pg_has_role(queue._caller(), g.role::oid, 'MEMBER'))),
                    '{}');
END
$$;
COMMENT ON FUNCTION queue._hidden_stages() IS 'Internal: the restricted stages the calling role (queue._caller()) may not see: not granted on them (grant_stage) and not skiplock_admin. The monitoring views leave their rows out.';
REVOKE ALL ON FUNCTION queue._hidden_stages() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue._hidden_stages() TO skiplock_monitor, skiplock_admin;
