-- _fold_counts(): keeps queue.finished_counts bounded, for maintain(). Rows of a closed hour (before
-- the current one) of a backend merge into the hour's row (backend 0, minute the hour's start);
-- rows from before queue.hourly's 7 days move to queue.finished_dropped. Each row is deleted and
-- its runs added in the same statement, so no run is counted twice or lost; a count a late
-- transaction adds meanwhile is a row of its own, folded at the next call. Hours are binned in
-- UTC (date_bin), as _count_minute bins minutes. Returns the rows it deleted.
-- Writes queue.finished_counts and queue.finished_dropped (locks the rows it folds); raises nothing.
CREATE OR REPLACE FUNCTION queue._fold_counts()
    RETURNS integer
    LANGUAGE plpgsql
    VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hour   timestamptz := pg_catalog.date_bin(interval '1 hour', pg_catalog.now(), timestamptz '2000-01-01 00:00+00');
    v_old    integer;
    v_merged integer;
BEGIN
    WITH gone AS (
        DELETE FROM queue.finished_counts c
         WHERE c.minute < v_hour - interval '7 days'
        RETURNING c.stage, c.status, c.runs
    ), added AS (
        INSERT INTO queue.finished_dropped AS d (stage, status, total)
        SELECT g.stage, g.status, pg_catalog.sum(g.runs)::bigint
          FROM gone g
         GROUP BY g.stage, g.status
        ON CONFLICT ON CONSTRAINT finished_dropped_pkey DO UPDATE
           SET total = d.total OPERATOR(pg_catalog.+) excluded.total
    )
    SELECT pg_catalog.count(*)::integer INTO v_old FROM gone;
    WITH gone AS (
        DELETE FROM queue.finished_counts c
         WHERE c.minute < v_hour AND c.backend <> 0
        RETURNING c.stage, c.status, c.minute, c.runs
    ), merged AS (
        INSERT INTO queue.finished_counts AS k (stage, status, minute, backend, runs)
        SELECT g.stage, g.status, pg_catalog.date_bin(interval '1 hour', g.minute, timestamptz '2000-01-01 00:00+00'), 0,
               pg_catalog.sum(g.runs)::bigint
          FROM gone g
         GROUP BY 1, 2, 3
        ON CONFLICT ON CONSTRAINT finished_counts_pkey DO UPDATE
           SET runs = k.runs OPERATOR(pg_catalog.+) excluded.runs
    )
    SELECT pg_catalog.count(*)::integer INTO v_merged FROM gone;
    RETURN v_old + v_merged;
END
$$;
COMMENT ON FUNCTION queue._fold_counts() IS 'Internal, for maintain: merges queue.finished_counts'' rows of closed hours into one a stage, status and hour, and moves those older than 7 days to queue.finished_dropped. Returns the rows deleted.';
REVOKE ALL ON FUNCTION queue._fold_counts() FROM PUBLIC;
