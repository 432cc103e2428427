-- _next_slot(slot, repeat, drift, finished): when a periodic task whose run ended at `finished`
-- runs next. With drift: the first slot + k * repeat (k >= 1) after `finished`, so missed slots are
-- skipped, never caught up in a burst, and the schedule keeps its phase (every hour at :15 stays at
-- :15). Without drift: finished + repeat. k is estimated from the lengths in seconds, then stepped
-- to the exact slot (repeat has no negative part: enqueue checks).
-- Computed in UTC (TimeZone pinned): a day is 24 hours and a month a UTC calendar month, whatever
-- the finishing worker's session says. A month is clamped to the end of a shorter one and the
-- clamped slot is kept (from 31 January: 28 February, then the 28th). Wall-clock times and days of
-- the month are queue.schedule()'s. Reads and writes nothing.
CREATE OR REPLACE FUNCTION queue._next_slot(slot timestamptz, repeat interval, drift boolean, finished timestamptz)
    RETURNS timestamptz
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
    SET TimeZone = 'UTC'
AS $$
DECLARE
    v_k bigint;
BEGIN
    IF NOT _next_slot.drift THEN
        RETURN _next_slot.finished + _next_slot.repeat;
    END IF;
    v_k := greatest(1, pg_catalog.floor(pg_catalog.date_part('epoch', _next_slot.finished - _next_slot.slot)
                                        / pg_catalog.date_part('epoch', _next_slot.repeat))::bigint + 1);
    WHILE _next_slot.slot + v_k * _next_slot.repeat <= _next_slot.finished LOOP
        v_k := v_k + 1;
    END LOOP;
    WHILE v_k > 1 AND _next_slot.slot + (v_k - 1) * _next_slot.repeat > _next_slot.finished LOOP
        v_k := v_k - 1;
    END LOOP;
    RETURN _next_slot.slot + v_k * _next_slot.repeat;
END
$$;
COMMENT ON FUNCTION queue._next_slot(timestamptz, interval, boolean, timestamptz) IS 'Internal: the next run of a periodic task: with drift the first slot + k * repeat after the finish (missed slots skipped), else finish + repeat. Computed in UTC; a month from the 31st is clamped (28 February) and stays on the clamped day.';
REVOKE ALL ON FUNCTION queue._next_slot(timestamptz, interval, boolean, timestamptz) FROM PUBLIC;
