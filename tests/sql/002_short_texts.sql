-- The texts \df+ and \d+ show a DBA are short: every comment on an object of schema queue (its
-- functions, tables, views, partitions, types and their columns) is at most 250 characters, and
-- every public function, table and view has one. Rationale belongs in docs/decisions.md; the
-- file headers are checked by tests/py/test_short_texts.py. Catalog queries only; changes nothing.
BEGIN;
SELECT plan(4);

SELECT is_empty(
    $$SELECT o.what || coalesce('.' || a.attname, '') AS what, pg_catalog.length(d.description) AS chars
        FROM pg_catalog.pg_description d
        JOIN (SELECT 'pg_catalog.pg_proc'::regclass AS cls, p.oid, p.oid::regprocedure::text AS what
                FROM pg_catalog.pg_proc p
               WHERE p.pronamespace = 'queue'::regnamespace
              UNION ALL
              SELECT 'pg_catalog.pg_class'::regclass, c.oid, c.oid::regclass::text
                FROM pg_catalog.pg_class c
               WHERE c.relnamespace = 'queue'::regnamespace
              UNION ALL
              SELECT 'pg_catalog.pg_type'::regclass, t.oid, t.oid::regtype::text
                FROM pg_catalog.pg_type t
               WHERE t.typnamespace = 'queue'::regnamespace) o
          ON o.cls = d.classoid AND o.oid = d.objoid
        LEFT JOIN pg_catalog.pg_attribute a
          ON o.cls = 'pg_catalog.pg_class'::regclass AND a.attrelid = d.objoid AND a.attnum = d.objsubid
       WHERE pg_catalog.length(d.description) > 250$$,
    'every comment on a function, relation or type of queue (and on their columns) is at most 250 characters (listed: the longer ones)'
);

SELECT is_empty(
    $$SELECT pg_catalog.length(pg_catalog.obj_description('queue'::regnamespace, 'pg_namespace'))
       WHERE pg_catalog.length(pg_catalog.obj_description('queue'::regnamespace, 'pg_namespace')) > 250$$,
    'the comment on schema queue is at most 250 characters'
);

SELECT is_empty(
    $$SELECT p.oid::regprocedure::text
        FROM pg_catalog.pg_proc p
       WHERE p.pronamespace = 'queue'::regnamespace
         AND p.proname !~ '^_'
         AND pg_catalog.btrim(coalesce(pg_catalog.obj_description(p.oid, 'pg_proc'), '')) = ''$$,
    'every public function of queue has a comment (listed: those without)'
);

SELECT is_empty(
    $$SELECT c.oid::regclass::text
        FROM pg_catalog.pg_class c
       WHERE c.relnamespace = 'queue'::regnamespace
         AND c.relkind IN ('r', 'p', 'v', 'm')
         AND c.relname <> 'skiplock_version'
         AND pg_catalog.btrim(coalesce(pg_catalog.obj_description(c.oid, 'pg_class'), '')) = ''$$,
    'every table and view of queue has a comment (listed: those without)'
);

SELECT * FROM finish();
ROLLBACK;
