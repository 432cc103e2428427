DROP TYPE IF EXISTS queue.task_status_live;
