-- _retry_delay(settings, attempt): how long a task that failed its attempt-th attempt waits:
-- linear or exponential from backoff_base, capped at backoff_cap, spread by backoff_jitter.
-- The cap is applied before the interval is built: base * 2^(attempt-1) overflows an interval long
-- before attempts run out, and a raise here would abort fail() and the whole reap_hung() call.
-- Reads and writes nothing; raises nothing.
CREATE OR REPLACE FUNCTION queue._retry_delay(settings queue.stage_settings, attempt integer)
    RETURNS interval
    LANGUAGE sql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT least(
               $1.backoff_cap,
               CASE
                   WHEN pg_catalog.date_part('epoch', $1.backoff_base) * f.factor
                        >= pg_catalog.date_part('epoch', $1.backoff_cap) THEN $1.backoff_cap
                   ELSE $1.backoff_base * f.factor
               END * (1 + $1.backoff_jitter * (2 * pg_catalog.random() - 1)))
      FROM (SELECT CASE $1.backoff
                       WHEN 'linear' THEN greatest($2, 1)::double precision
                       ELSE pg_catalog.power(2::double precision, least(greatest($2, 1) - 1, 62))
                   END AS factor) f
$$;
COMMENT ON FUNCTION queue._retry_delay(queue.stage_settings, integer) IS 'Internal: retry delay after a failed attempt: linear (base * attempt) or exponential (base * 2^(attempt-1)), capped, with jitter.';
REVOKE ALL ON FUNCTION queue._retry_delay(queue.stage_settings, integer) FROM PUBLIC;
