-- The ceiling: the cheapest durable write a queue could hope to match, one single-row INSERT
-- into a table with a bigint identity key and a jsonb column (scripts/ceiling_insert.sql).
CREATE TABLE ceiling (
    id      bigint NOT NULL GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payload jsonb  NOT NULL
);
