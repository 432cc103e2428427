-- W2b with consume: take up to :batch due tasks and record them done in one statement, in the
-- caller's transaction (for work done inside it). Variables: stage, batch.
SELECT count(*) AS n FROM queue.consume(:stage, :batch)
\gset
\if :n = 0
\sleep 10 ms
\endif
