DROP TABLE IF EXISTS queue.fence_key;
