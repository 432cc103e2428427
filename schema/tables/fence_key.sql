-- The secret that makes take_locked's claims unforgeable. take_locked records each task it takes
-- in the transaction-local setting skiplock.held with a code derived from this key, the
-- transaction's id and the task's id (_held_entry); finish_locked and fail_locked end only tasks
-- whose code matches. Only skiplock_owner (and so the SECURITY DEFINER functions) can read it.
CREATE TABLE queue.fence_key (
    key text NOT NULL CONSTRAINT fence_key_long CHECK (pg_catalog.length(key) >= 32)
);
CREATE UNIQUE INDEX fence_key_one_row ON queue.fence_key ((true));
INSERT INTO queue.fence_key (key)
VALUES (pg_catalog.md5(pg_catalog.gen_random_uuid()::text) || pg_catalog.md5(pg_catalog.gen_random_uuid()::text));

COMMENT ON TABLE queue.fence_key IS 'One random key, readable only by skiplock_owner: take_locked signs the tasks it hands out with it, so that no session can claim in skiplock.held a task it did not take.';
COMMENT ON COLUMN queue.fence_key.key IS 'Random secret (64 hex digits) made at install; never shown to application roles.';
