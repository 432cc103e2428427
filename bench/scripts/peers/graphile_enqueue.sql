-- Peers, W1, Graphile Worker: one job a transaction through its public SQL API (graphile_worker.add_job).
SELECT graphile_worker.add_job('noop', '{"doc": 42}'::json);
