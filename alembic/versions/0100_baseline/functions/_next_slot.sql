-- _next_slot(slot, repeat, drift, finished): when a periodic task runs next, its run having ended
-- at `finished`. With drift: the first slot + k * repeat (k >= 1) after `finished`, so missed slots
-- are skipped, never caught up in a burst, and the schedule keeps its phase (every hour at :15
-- stays at :15). Without drift: finished + repeat. repeat has no negative part (enqueue checks),
-- so slot + k * repeat grows with k; months and days vary in length, so k is first estimated
-- from the lengths in seconds and then stepped to the exact slot.
-- The arithmetic runs in UTC (TimeZone pinned): a day is 24 hours and a month a calendar month
-- of UTC, whatever the finishing worker's session says, so identical tasks re-arm alike. A
-- repeat is not a wall-clock schedule (09:00 in Berlin is 07:00 UTC in summer, 08:00 in winter):
-- that is queue.schedule() with a time zone. A month is clamped to the end of a shorter one and
-- the clamped slot is stored: from 31 January, '1 month' gives 28 February, then the 28th for
-- good. A day of the month is queue.schedule() too ('0 0 31 * *' fires on every 31st; the
-- parser has no L for the last day).
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
COMMENT ON FUNCTION queue._next_slot(timestamptz, interval, boolean, timestamptz) IS 'Internal: the next run of a periodic task: with drift the first slot + k * repeat after the finish (missed slots skipped), without drift finish + repeat. Computed in UTC (a day is 24 h whatever the session''s TimeZone); a month from the 31st is clamped (28 February) and stays on the clamped day.';
REVOKE ALL ON FUNCTION queue._next_slot(timestamptz, interval, boolean, timestamptz) FROM PUBLIC;
