-- The multi-stage takes of 0110 go: the previous revisions' copies of take_next, take_locked and
-- consume (run before this file) restored only the single-stage functions of those files.
DROP FUNCTION queue.take_next(text[], integer, interval, text);
DROP FUNCTION queue.take_locked(text[], integer);
DROP FUNCTION queue.consume(text[], integer);
