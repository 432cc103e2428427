-- _bounded_error(text): error texts are kept to 2,000 characters so that stack traces are not
-- TOASTed into the hot table; a cut text says how long it was.
CREATE OR REPLACE FUNCTION queue._bounded_error(error text)
    RETURNS text
    LANGUAGE sql
    IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
               WHEN $1 IS NULL THEN NULL
               WHEN pg_catalog.length($1) <= 2000 THEN $1
               ELSE pg_catalog.left($1, 1960) || pg_catalog.format(' … [cut, %s characters in all]', pg_catalog.length($1))
           END
$$;
COMMENT ON FUNCTION queue._bounded_error(text) IS 'Internal: an error text cut to at most 2,000 characters, marked with its full length when cut.';
REVOKE ALL ON FUNCTION queue._bounded_error(text) FROM PUBLIC;
