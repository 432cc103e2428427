-- _held_entry(key, xact, id): the entry of a task in the setting skiplock.held, '<id>:<code>,',
-- the code the md5 of key, the transaction's id and the task's id. The code binds the id, so the
-- list needs no leading delimiter. Callers pass as key queue.fence_key's key, then '/<attempt>/<run_at
-- as epoch>' of the take (so that an entry matches the task only as it was taken: not once another
-- transaction failed, re-ran or re-armed it), and the id of the top-level transaction. No SET clause, so that the planner inlines it into the
-- caller's statement, which runs with the caller's pinned search_path; concat, not ||, so that a
-- call evaluates three functions, not ten (STABLE, as concat is).
CREATE OR REPLACE FUNCTION queue._held_entry(key text, xact xid8, id bigint)
    RETURNS text
    LANGUAGE sql
    STABLE
    PARALLEL SAFE
AS $$
    SELECT pg_catalog.concat(id, ':', pg_catalog.md5(pg_catalog.concat(key, '/', xact, '/', id)), ',')
$$;
COMMENT ON FUNCTION queue._held_entry(text, xid8, bigint) IS 'Internal, for take_locked, finish_locked, fail_locked and enqueue: a task''s entry in the transaction-local setting skiplock.held, signed with queue.fence_key.';
REVOKE ALL ON FUNCTION queue._held_entry(text, xid8, bigint) FROM PUBLIC;
