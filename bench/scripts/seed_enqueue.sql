-- Seed baseline, W1: the article's add. Ids come from the client, as in the article: each
-- pgbench client counts up in its own range. Variables: n (start at 1).
\set id :client_id * 1000000000000 + :n
\set n :n + 1
insert into task (id) values (:id) on conflict (id) do nothing;
