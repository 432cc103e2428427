-- Seed 004's design (a cloud task scheduler, 2017): one task table and one history table per
-- tenant, an insert function that picks the tenant's table, and a consume that moves a batch of
-- the tenant's tasks to its history in one statement, under a transaction-level advisory lock
-- per tenant. Tables, columns and function bodies as the article writes them (lower case as
-- there); only the tenant count is a psql-free DO block here. It runs in a database of its own
-- (`seed004`); scripts/seed004_*.sql drive it, scripts/skiplock004_*.sql drive skiplock.
create table task_init (  -- initial tasks
  uid int,           -- tenant id
  ptid serial8,      -- parent task id
  tid serial,        -- task id
  state int default 1,  -- 1 new, -1 running, 0 done
  retry int default -1, -- retries
  info text,         -- other information
  ts timestamp       -- time
);
create table task_hist (  -- finished tasks
  uid int,
  ptid int8,
  tid int,
  state int default 1,
  retry int default -1,
  info text,
  ts timestamp
);
do language plpgsql $$
declare
begin
  for i in 1..1000 loop
    execute 'create table task_init_'||i||' ( like task_init including all)';
    execute 'create table task_hist_'||i||' ( like task_hist including all)';
  end loop;
end;
$$;

create or replace function ins_task_init(
  uid int,
  info text,
  ts timestamp
) returns void as $$
declare
  target name;
begin
  target := format('%I', 'task_init_'||uid);
  execute format('insert into %I (uid,info,ts) values (%L,%L,%L)', target, uid,info,ts);
end;
$$ language plpgsql strict;

create or replace function run_task(
  uid int,
  batch int
) returns void as $$
declare
  target1 name;
  target2 name;
begin
  target1 := format('%I', 'task_init_'||uid);
  target2 := format('%I', 'task_hist_'||uid);
  execute format('with t1 as (select ctid from %I where pg_try_advisory_xact_lock(%L) limit %s) , t2 as (delete from %I where ctid = any (array(select ctid from t1)) returning *) insert into %I select * from t2;', target1, uid, batch, target1, target2);
end;
$$ language plpgsql strict;
