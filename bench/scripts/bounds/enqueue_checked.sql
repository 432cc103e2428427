-- Bound, W1: bounds/enqueue_wrapped.sql's function with enqueue's tests of its stage and payload
-- (bounds/wrapped.sql): what refusing bad input adds to the call. Variables: stage.
SELECT bounds.enqueue_checked('{"doc": 42}', :stage);
