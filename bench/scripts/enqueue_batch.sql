-- W1b: enqueue a batch per call. Variables: stage, payloads (a jsonb[] literal built by the harness).
SELECT * FROM queue.enqueue_batch(:payloads, :stage);
