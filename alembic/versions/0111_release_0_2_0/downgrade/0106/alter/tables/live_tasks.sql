-- Back to 0105: the column CHECK on live_tasks.attempt (validated against the rows).
ALTER TABLE queue.live_tasks
    ADD CONSTRAINT live_tasks_attempt_not_negative CHECK (attempt >= 0);
