-- Ceiling: a round trip that does nothing.
SELECT 1;
