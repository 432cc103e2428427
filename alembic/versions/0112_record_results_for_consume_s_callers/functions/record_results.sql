-- record_results(stage, ids, results): the results of tasks this transaction consumed. After
-- consume(stage) (or drain) and the work, in the same transaction: sets queue.history.result of the
-- done run of ids[i] to results[i] (an id given twice: its first result). Only rows this
-- transaction wrote are touched: done, in that stage, no result yet, no SQL task, started at this
-- transaction's now() (consume stamps it so) and inserted by this transaction (xmin, the inserting
-- transaction's id). Any other id is skipped: another transaction's consumed run, a run finished
-- earlier, one already recorded, an unknown id, a NULL element of results. Rows consumed inside a
-- savepoint carry the subtransaction's id and are skipped too: call consume at the transaction's
-- top level. A stage that keeps no history of done runs (history 'none', 'failures') has no row to
-- record. Returns how many results it set.
-- Raises 22004 for a NULL stage, ids or results, 22023 for a bad stage, arrays of unequal length,
-- more than 10000 ids or a JSON scalar result, 54000 for a result over 1 MiB, 42501 for a
-- restricted stage the caller may not take from. Writes queue.history (row locks on those rows).
CREATE OR REPLACE FUNCTION queue.record_results(stage text, ids bigint[], results jsonb[])
    RETURNS integer
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The transaction's id if it has one (a transaction that wrote nothing consumed nothing).
    v_xid  xid := pg_catalog.xid(pg_catalog.pg_current_xact_id_if_assigned());
    v_now  timestamptz := pg_catalog.now();
    v_done integer;
    v_bad  text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN record_results.stage IS NULL OR record_results.stage IN ('', '*')
                       OR pg_catalog.octet_length(record_results.stage) > 54 THEN 'stage'
                  WHEN record_results.ids IS NULL OR record_results.results IS NULL
                       OR pg_catalog.cardinality(record_results.ids) <> pg_catalog.cardinality(record_results.results) THEN 'ids, results'
                  WHEN pg_catalog.cardinality(record_results.ids) > 10000 THEN 'batch'
                  WHEN EXISTS (SELECT FROM pg_catalog.unnest(record_results.results) AS r(r)
                                WHERE pg_catalog.jsonb_typeof(r.r) NOT IN ('object', 'array')
                                   OR pg_catalog.pg_column_size(r.r) > 1048576
                                   OR pg_catalog.pg_column_compression(r.r) IS NOT NULL) THEN 'results[i]' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('record_results', v_bad, pg_catalog.jsonb_build_object(
            'stage', record_results.stage, 'ids', record_results.ids::text,
            'batch', pg_catalog.cardinality(record_results.ids)::text, 'results', record_results.results::text));
    END IF;
    -- </arguments>
    IF (queue._settings(record_results.stage)).restricted THEN
        PERFORM queue._check_access(record_results.stage, 'take');
    END IF;
    IF v_xid IS NULL THEN
        RETURN 0;
    END IF;

    UPDATE queue.history h
       SET result = r.result
      FROM (SELECT DISTINCT ON (g.id) g.id, g.result  -- an id given twice: its first result
              FROM ROWS FROM (pg_catalog.unnest(record_results.ids), pg_catalog.unnest(record_results.results))
                   WITH ORDINALITY AS g(id, result, n)
             WHERE g.result IS NOT NULL
             ORDER BY g.id, g.n) AS r
     WHERE h.stage OPERATOR(pg_catalog.=) record_results.stage
       AND h.id OPERATOR(pg_catalog.=) r.id
       AND h.status OPERATOR(pg_catalog.=) 'done'
       AND h.result IS NULL
       AND h.run_as IS NULL
       -- This transaction's rows: the xid alone could be an old frozen row's after wraparound.
       AND h.started OPERATOR(pg_catalog.=) v_now
       AND h.xmin OPERATOR(pg_catalog.=) v_xid;
    GET DIAGNOSTICS v_done = ROW_COUNT;
    RETURN v_done;
END
$$;
COMMENT ON FUNCTION queue.record_results(text, bigint[], jsonb[]) IS 'Stores results[i] as the result of task ids[i] consumed (queue.consume) earlier in this same transaction, at its top level; other ids are skipped. Returns how many results it stored.';
REVOKE ALL ON FUNCTION queue.record_results(text, bigint[], jsonb[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.record_results(text, bigint[], jsonb[]) TO skiplock_worker, skiplock_admin;
