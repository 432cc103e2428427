-- _rate_bin(at, settings, burst): the start of the rate window of a rate-limited stage
-- that holds `at`: a multiple of rate_window since the Unix epoch, or, with burst, of its burst
-- part rate_window * rate_burst / rate_limit (at least a microsecond). Pure; reads nothing.
CREATE OR REPLACE FUNCTION queue._rate_bin(
        at       timestamptz,
        settings queue.stage_settings,
        burst    boolean)
    RETURNS timestamptz
    LANGUAGE sql
    IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.date_bin(
               CASE WHEN _rate_bin.burst AND _rate_bin.settings.rate_burst < _rate_bin.settings.rate_limit
                    THEN greatest(interval '1 microsecond',
                                  _rate_bin.settings.rate_window
                                  * (_rate_bin.settings.rate_burst::float8 / _rate_bin.settings.rate_limit))
                    ELSE _rate_bin.settings.rate_window END,
               _rate_bin.at,
               timestamptz 'epoch')
$$;
COMMENT ON FUNCTION queue._rate_bin(timestamptz, queue.stage_settings, boolean) IS 'Internal: the start of the rate window (or, with burst, of its burst part) of a rate-limited stage that holds a time; windows are multiples of their length since the Unix epoch.';
REVOKE ALL ON FUNCTION queue._rate_bin(timestamptz, queue.stage_settings, boolean) FROM PUBLIC;
