-- The view is dropped before views/tasks.sql makes it again. On Citus it is a distributed object
-- once distribute ran, and CREATE OR REPLACE of it with a new dependency on queue.dependencies (a
-- local table until distribute runs again) is refused; a new view on it is made on the coordinator.
-- squawk-ignore ban-drop-view
DROP VIEW IF EXISTS queue.tasks;
