-- W1: enqueue one task per transaction. Variables: stage.
SELECT queue.enqueue('{"doc": 42}', :stage);
