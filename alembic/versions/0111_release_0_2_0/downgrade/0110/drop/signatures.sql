-- Before the previous copies run: the forms this revision added (a CREATE OR REPLACE of the old
-- form would leave them beside it, and a call without the new argument would be ambiguous), and
-- the view whose new column CREATE OR REPLACE VIEW cannot remove.
DROP VIEW IF EXISTS queue.tasks;
DROP FUNCTION IF EXISTS queue.finish(bigint, uuid, text, text, jsonb);
DROP FUNCTION IF EXISTS queue.finish_locked(bigint, text, text, jsonb);
DROP FUNCTION IF EXISTS queue.finish_batch(bigint[], uuid[], text, jsonb[]);
DROP FUNCTION IF EXISTS queue.finish_and_take(bigint, uuid, text, integer, interval, text, jsonb);
DROP FUNCTION IF EXISTS queue.heartbeat(bigint, uuid, interval, text, jsonb);
DROP FUNCTION IF EXISTS queue.schedule(text, text, text, jsonb, integer, text, boolean);
DROP FUNCTION IF EXISTS queue._rearm(queue.live_tasks, queue.task_status, integer, text, text, timestamptz, timestamptz, jsonb);
DROP FUNCTION IF EXISTS queue._history_row(queue.live_tasks, queue.task_status, integer, text, text, timestamptz, timestamptz, jsonb);
DROP FUNCTION IF EXISTS queue._check_payload(jsonb, text);
