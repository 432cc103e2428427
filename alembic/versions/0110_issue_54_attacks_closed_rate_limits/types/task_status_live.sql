-- The status of a live task, a type of its own so that queue.live_tasks needs no CHECK on it
-- (a table CHECK is set up for every statement that writes a row; an enum costs nothing).
CREATE TYPE queue.task_status_live AS ENUM ('ready', 'running', 'error', 'waiting');
COMMENT ON TYPE queue.task_status_live IS 'The status of a live task: ready, running, error or waiting (the final ones, in queue.history, are queue.task_status).';
