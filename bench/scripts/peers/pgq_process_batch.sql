-- Peers, W2b, PgQ: its consumer loop: next_batch, read the batch's events (get_batch_events),
-- finish_batch. A batch is whatever the ticks cut (the preload ticks every 100 events); when no
-- batch is ready the consumer ticks itself (what pgqd does) and waits a little. PgQ acks batches,
-- not events: a consumer gets every event, so one client drives one consumer. Variables: queue, consumer.
SELECT coalesce(pgq.next_batch(:queue, :consumer), 0) AS batch
\gset
\if :batch > 0
SELECT count(*) AS n FROM pgq.get_batch_events(:batch)
\gset
SELECT pgq.finish_batch(:batch);
\else
SELECT pgq.ticker();
\sleep 10 ms
\endif
