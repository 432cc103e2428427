-- W2 with the combined call: finish the task taken by the previous iteration and take the next
-- one in one round trip and one commit (queue.finish_and_take), as a worker loop does. The
-- client's first iteration has nothing to finish (id 0). When nothing is due, the row has no
-- task: wait a little, as a real worker would. Variables: stage, id, lease (initially 0 and zero).
SELECT coalesce(t.id, 0) AS id,
       coalesce(t.lease, '00000000-0000-0000-0000-000000000000') AS lease
  FROM queue.finish_and_take(NULLIF(:id, 0), NULLIF(:lease, '00000000-0000-0000-0000-000000000000')::uuid, :stage) AS t
\gset
\if :id = 0
\sleep 10 ms
\endif
