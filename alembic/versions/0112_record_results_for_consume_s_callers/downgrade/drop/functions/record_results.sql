DO $$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'queue'::regnamespace AND p.proname = 'record_results'
    LOOP
        EXECUTE 'DROP ROUTINE ' || f;
    END LOOP;
END
$$;
