-- _count_dropped(stage, status, runs): adds runs finished runs of a stage and status to
-- queue.finished_dropped, before they leave queue.history.
-- _count_dropped(part_schema, part_name): the same for every row of a history partition about to
-- be dropped, detached or emptied: one read of it, one upsert per stage and status.
-- Writes queue.finished_dropped (locks its rows). Internal: called by rotate_partitions and retry.
CREATE OR REPLACE FUNCTION queue._count_dropped(stage text, status queue.task_status, runs bigint)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO queue.finished_dropped AS d (stage, status, total)
    VALUES (_count_dropped.stage, _count_dropped.status, _count_dropped.runs)
    ON CONFLICT ON CONSTRAINT finished_dropped_pkey DO UPDATE
       SET total = d.total OPERATOR(pg_catalog.+) excluded.total;
END
$$;
COMMENT ON FUNCTION queue._count_dropped(text, queue.task_status, bigint) IS 'Internal: adds finished runs that leave queue.history to queue.finished_dropped, so that queue.finished_totals never goes down.';
REVOKE ALL ON FUNCTION queue._count_dropped(text, queue.task_status, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION queue._count_dropped(part_schema text, part_name text)
    RETURNS void
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_stage  text;
    v_status queue.task_status;
    v_runs   bigint;
BEGIN
    -- Read here, written by the call above: on Citus a write from inside the read would run on
    -- the shards' nodes, as a distributed query nested in a shard's query.
    FOR v_stage, v_status, v_runs IN EXECUTE pg_catalog.format(
            'SELECT h.stage, h.status, pg_catalog.count(*) FROM %I.%I h GROUP BY h.stage, h.status',
            _count_dropped.part_schema, _count_dropped.part_name)
    LOOP
        PERFORM queue._count_dropped(v_stage, v_status, v_runs);
    END LOOP;
END
$$;
COMMENT ON FUNCTION queue._count_dropped(text, text) IS 'Internal: adds every row of a history partition about to be dropped, detached or emptied to queue.finished_dropped.';
REVOKE ALL ON FUNCTION queue._count_dropped(text, text) FROM PUBLIC;
