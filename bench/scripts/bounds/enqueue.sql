-- Bound, W1: skiplock's table with no function: one INSERT of a task into queue.live_tasks, the
-- statement enqueue runs, without its checks, its settings lookup or its wake-up test. Not a way to
-- use skiplock (it skips every check): the floor under what enqueue can cost. Variables: stage.
INSERT INTO queue.live_tasks (stage, payload) VALUES (:stage, '{"doc": 42}');
