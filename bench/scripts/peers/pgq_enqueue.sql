-- Peers, W1, PgQ: one event a transaction (pgq.insert_event). Variables: queue.
SELECT pgq.insert_event(:queue, 'noop', '{"doc": 42}');
