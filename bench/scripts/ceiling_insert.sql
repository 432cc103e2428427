-- Ceiling: one single-row INSERT per transaction.
INSERT INTO ceiling (payload) VALUES ('{"doc": 42}');
