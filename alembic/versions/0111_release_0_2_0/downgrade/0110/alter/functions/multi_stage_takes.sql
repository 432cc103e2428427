-- The multi-stage takes of 0110 go: the previous revisions' copies of take_next, take_locked and
-- consume (run before this file) restored only the single-stage functions of those files.
DROP FUNCTION IF EXISTS queue.take_next(text[], integer, interval, text);
DROP FUNCTION IF EXISTS queue.take_locked(text[], integer);
DROP FUNCTION IF EXISTS queue.consume(text[], integer);
