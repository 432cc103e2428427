-- Bound, W1: bounds/enqueue.sql's INSERT inside a minimal SECURITY DEFINER function
-- (bounds/wrapped.sql): what the call alone costs, without what queue.enqueue checks. Variables: stage.
SELECT bounds.enqueue('{"doc": 42}', :stage);
