-- queue.live_tasks loses its column CHECK on attempt: live_tasks_valid tests the same
-- (attempt >= 0), and PostgreSQL set each CHECK up again for every statement that wrote a row.
-- squawk-ignore ban-drop-constraint
ALTER TABLE queue.live_tasks DROP CONSTRAINT live_tasks_attempt_not_negative;
