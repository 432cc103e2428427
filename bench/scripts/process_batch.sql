-- W2b: take a batch and finish it in one call. Variables: stage, batch.
SELECT count(*) AS n, array_agg(t.id) AS ids, array_agg(t.lease) AS leases
  FROM queue.take_next(:stage, batch => :batch) AS t
\gset
\if :n > 0
SELECT queue.finish_batch(:ids, :leases, stage => :stage);
\else
\sleep 10 ms
\endif
