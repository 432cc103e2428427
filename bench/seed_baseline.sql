-- The seed baseline: the basic queue of seed 001 ("Базовая очередь"), quoted exactly as the
-- article writes it, so that every benchmark run shows skiplock beside the design it improves.
-- It runs in a database of its own (`seed`). The article keeps only task ids ("for simplicity
-- only the unique task ids are stored"), so its rows carry no payload, and finished tasks stay
-- in the table with status 2.
--
-- Statements, verbatim from the article (lower case as written there):
--   add:    insert into task (id) values ($1) on conflict (id) do nothing;
--   take:   with next_task as (
--           select id from task
--           where status = 0
--           limit 1
--           for update skip locked
--           )
--           update task
--           set
--           status = 1
--           from next_task
--           where task.id = next_task.id
--           returning task.id;
--   finish: update task
--           set
--           status = 2
--           where id = $1;
-- The pgbench scripts scripts/seed_enqueue.sql and scripts/seed_process.sql run them; the take is
-- wrapped in one more CTE only so that an empty queue still returns a row for \gset.

create table task
(
id bigint not null primary key,
status integer not null default 0 -- 0 - новая, 1 - в работе, 2 - выполнена
);
create index task__status__idx on task (status);
