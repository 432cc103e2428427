-- _next_slot(slot, repeat, drift, finished): when a periodic task runs next, its run having ended
-- at `finished`. With drift: the first slot + k * repeat (k >= 1) after `finished`, so missed slots
-- are skipped, never caught up in a burst, and the schedule keeps its phase (every hour at :15
-- stays at :15). Without drift: finished + repeat. repeat has no negative part (enqueue checks),
-- so slot + k * repeat grows with k; months and days vary in length, so k is first estimated
-- from the lengths in seconds and then stepped to the exact slot.
CREATE OR REPLACE FUNCTION queue._next_slot(slot timestamptz, repeat interval, drift boolean, finished timestamptz)
    RETURNS timestamptz
    LANGUAGE plpgsql
    STABLE
    SET search_path = pg_catalog, pg_temp
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
COMMENT ON FUNCTION queue._next_slot(timestamptz, interval, boolean, timestamptz) IS 'Internal: the next run of a periodic task: with drift the first slot + k * repeat after the finish (missed slots skipped), without drift finish + repeat.';
REVOKE ALL ON FUNCTION queue._next_slot(timestamptz, interval, boolean, timestamptz) FROM PUBLIC;
