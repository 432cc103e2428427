-- Seed baseline, W2 (and the workers of W3): the article's take, then its finish, a round trip
-- each. The take is the article's statement; the outer CTE only turns "no row" into id 0.
with taken as (
with next_task as (
select id from task
where status = 0
limit 1
for update skip locked
)
update task
set
status = 1
from next_task
where task.id = next_task.id
returning task.id
)
select coalesce(max(id), 0) as id from taken
\gset
\if :id > 0
update task
set
status = 2
where id = :id;
\else
\sleep 10 ms
\endif
