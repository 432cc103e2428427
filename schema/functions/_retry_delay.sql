-- _retry_delay(settings, attempt): how long a task that failed its attempt-th attempt waits.
CREATE OR REPLACE FUNCTION queue._retry_delay(settings queue.stage_settings, attempt integer)
    RETURNS interval
    LANGUAGE sql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT least(
               $1.backoff_cap,
               least(
                   $1.backoff_cap,
                   CASE $1.backoff
                       WHEN 'linear' THEN $1.backoff_base * greatest($2, 1)
                       ELSE $1.backoff_base * pg_catalog.power(2, least(greatest($2, 1) - 1, 30))
                   END
               ) * (1 + $1.backoff_jitter * (2 * pg_catalog.random() - 1)))
$$;
COMMENT ON FUNCTION queue._retry_delay(queue.stage_settings, integer) IS 'Internal: retry delay after a failed attempt: linear (base * attempt) or exponential (base * 2^(attempt-1)), capped, with jitter.';
REVOKE ALL ON FUNCTION queue._retry_delay(queue.stage_settings, integer) FROM PUBLIC;
