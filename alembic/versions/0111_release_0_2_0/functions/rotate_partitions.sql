-- rotate_partitions(now): keep queue.history partitioned by finish time per queue.history_policy:
--   1. creates the partitions missing from the current period to `premake` periods ahead (UTC
--      periods named from their start: history_20261122, history_2026112213), only the uncovered
--      rest where partitions of another size cover part of a period; a range with rows in the
--      default partition gets none ('skipped: rows in default');
--   2. empties the default partition (TRUNCATE) once every row in it is past the retention; under
--      retention_action 'detach' it first copies them to queue.history_default_<UTC time>;
--   3. drops or detaches each partition whose whole range ends before now - retention.
-- What it drops, detaches or empties is counted first into queue.finished_dropped (_count_dropped).
-- Returns a row per action (none when nothing was due) and records last_rotated. Waits at most
-- 100 ms for a lock, else skips that partition this round ('skipped: busy', naming the holders).
-- Holds ACCESS EXCLUSIVE on queue.history to the end of the transaction, except to attach partitions
-- over an hour ahead; a concurrent call returns 'skipped: rotation running'. Raises 22004 for NULL.
CREATE OR REPLACE FUNCTION queue.rotate_partitions(now timestamptz DEFAULT pg_catalog.now())
    RETURNS TABLE (action text, partition text, detail text)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    -- Partition bounds go into DDL as text: ISO prints a numeric offset, which reads back the
    -- same; other styles print a zone abbreviation, which PostgreSQL may read as another zone.
    SET DateStyle = 'ISO, YMD'
    -- Long enough for the finishes holding queue.history to commit, short enough to stall no one.
    SET lock_timeout = '100ms'
AS $$
DECLARE
    -- The advisory lock that serialises rotations (and maintain()'s decision to rotate).
    v_key       CONSTANT bigint := pg_catalog.hashtextextended('skiplock.rotate_partitions', 0);
    -- Periods are aligned to Monday 2000-01-03 00:00 UTC: days at midnight UTC, weeks on Mondays.
    v_origin    CONSTANT timestamp := timestamp '2000-01-03 00:00';
    v_policy    queue.history_policy;
    v_first     timestamp;     -- start of the current period, UTC
    v_cutoff    timestamptz;   -- partitions ending at or before it are past the retention
    v_lo        timestamptz;
    v_hi        timestamptz;
    v_piece     tstzrange;
    v_covered   tstzmultirange; -- what the dated partitions cover
    v_name      text;
    v_near      boolean;
    v_locking   text;          -- the relation the LOCK being attempted is for, for the report
    v_part      record;
    v_rows      bigint;
    v_oldest    timestamptz;
    v_newest    timestamptz;
    v_bad text;  -- the first bad argument's name
BEGIN
    -- <arguments> One test names the first bad argument; _raise_bad_argument says what is wrong.
    v_bad := CASE WHEN rotate_partitions.now IS NULL THEN 'now' END;
    IF v_bad IS NOT NULL THEN
        PERFORM queue._raise_bad_argument('rotate_partitions', v_bad, pg_catalog.jsonb_build_object(
            'now', rotate_partitions.now::text));
    END IF;
    -- </arguments>

    IF NOT pg_catalog.pg_try_advisory_xact_lock(v_key) THEN
        RETURN QUERY
        SELECT 'skipped: rotation running'::text, NULL::text,
               pg_catalog.format('Session %s is rotating queue.history; this call did nothing.',
                   coalesce((SELECT pg_catalog.string_agg(l.pid::text, ', ')
                               FROM pg_catalog.pg_locks l
                              WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                                AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                                   WHERE d.datname = pg_catalog.current_database())
                                AND ((l.classid::bigint << 32) | l.objid::bigint) = v_key
                                AND l.pid <> pg_catalog.pg_backend_pid()), 'another session'));
        RETURN;
    END IF;

    SELECT p.* INTO STRICT v_policy FROM queue.history_policy p;
    v_cutoff := ((rotate_partitions.now AT TIME ZONE 'UTC') - v_policy.retention) AT TIME ZONE 'UTC';
    v_first := pg_catalog.date_bin(v_policy.partition_interval, rotate_partitions.now AT TIME ZONE 'UTC', v_origin);

    -- 1. Create what is missing, from the current period to premake periods ahead. ----------------
    SELECT coalesce(pg_catalog.range_agg(h.range), '{}'::pg_catalog.tstzmultirange)
      INTO v_covered
      FROM queue._history_partitions() h;
    FOR v_i IN 0 .. v_policy.premake LOOP
        v_lo := (v_first + v_policy.partition_interval * v_i) AT TIME ZONE 'UTC';
        v_hi := (v_first + v_policy.partition_interval * (v_i + 1)) AT TIME ZONE 'UTC';
        FOR v_piece IN
            SELECT u.piece
              FROM pg_catalog.unnest(pg_catalog.tstzmultirange(pg_catalog.tstzrange(v_lo, v_hi)) - v_covered) AS u(piece)
             ORDER BY u.piece
        LOOP
            v_name := 'history_'
                   || pg_catalog.to_char(pg_catalog.lower(v_piece) AT TIME ZONE 'UTC',
                          CASE WHEN v_policy.partition_interval < interval '1 day'
                                 OR (pg_catalog.lower(v_piece) AT TIME ZONE 'UTC')::time <> time '00:00'
                               THEN 'YYYYMMDDHH24' ELSE 'YYYYMMDD' END)
                   || CASE WHEN pg_catalog.date_trunc('hour', pg_catalog.lower(v_piece) AT TIME ZONE 'UTC')
                                <> pg_catalog.lower(v_piece) AT TIME ZONE 'UTC'
                           THEN pg_catalog.to_char(pg_catalog.lower(v_piece) AT TIME ZONE 'UTC', 'MISS')
                           ELSE '' END;
            BEGIN
                v_locking := 'queue.history';
                v_near := pg_catalog.lower(v_piece) <= pg_catalog.clock_timestamp() + interval '1 hour';
                IF v_near THEN
                    LOCK TABLE ONLY queue.history IN ACCESS EXCLUSIVE MODE;
                ELSE
                    LOCK TABLE ONLY queue.history IN SHARE UPDATE EXCLUSIVE MODE;
                END IF;
                v_locking := 'queue.history_default';
                LOCK TABLE queue.history_default IN ACCESS EXCLUSIVE MODE;
                IF EXISTS (SELECT 1 FROM queue.history_default d
                            WHERE d.finished >= pg_catalog.lower(v_piece) AND d.finished < pg_catalog.upper(v_piece)) THEN
                    action := 'skipped: rows in default';
                    partition := pg_catalog.format('queue.%I', v_name);
                    detail := pg_catalog.format('queue.history_default holds rows finished from %s to %s UTC: they stay there until every row of the default partition is older than the retention, so this range gets no partition.',
                                  pg_catalog.to_char(pg_catalog.lower(v_piece) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'),
                                  pg_catalog.to_char(pg_catalog.upper(v_piece) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'));
                ELSE
                    EXECUTE pg_catalog.format('CREATE TABLE queue.%I (LIKE queue.history INCLUDING CONSTRAINTS)', v_name);
                    EXECUTE pg_catalog.format('ALTER TABLE queue.history ATTACH PARTITION queue.%I FOR VALUES FROM (%L) TO (%L)',
                                              v_name, pg_catalog.lower(v_piece), pg_catalog.upper(v_piece));
                    EXECUTE pg_catalog.format('COMMENT ON TABLE queue.%I IS %L', v_name,
                                pg_catalog.format('Finished tasks of %s to %s UTC: a partition of queue.history made by queue.rotate_partitions(); it goes once its whole range is older than the retention.',
                                    pg_catalog.to_char(pg_catalog.lower(v_piece) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'),
                                    pg_catalog.to_char(pg_catalog.upper(v_piece) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI')));
                    action := 'created';
                    partition := pg_catalog.format('queue.%I', v_name);
                    detail := pg_catalog.format('finished from %s to %s UTC (%s lock on queue.history)',
                                  pg_catalog.to_char(pg_catalog.lower(v_piece) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'),
                                  pg_catalog.to_char(pg_catalog.upper(v_piece) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'),
                                  CASE WHEN v_near THEN 'ACCESS EXCLUSIVE' ELSE 'SHARE UPDATE EXCLUSIVE' END);
                END IF;
                RETURN NEXT;
            EXCEPTION
                WHEN lock_not_available THEN
                    PERFORM pg_catalog.set_config('lock_timeout', '1ms', true);  -- one wait per call
                    action := 'skipped: busy';
                    partition := pg_catalog.format('queue.%I', v_name);
                    detail := pg_catalog.format('Not created: %s is locked by %s. The next rotation tries again; until then finishes in this range go to queue.history_default.',
                                  v_locking, queue._lock_holders(v_locking::regclass));
                    RETURN NEXT;
                WHEN duplicate_table THEN
                    action := 'skipped: name taken';
                    partition := pg_catalog.format('queue.%I', v_name);
                    detail := 'A table of that name that is not a partition of queue.history exists (a detached partition?): rename or drop it.';
                    RETURN NEXT;
            END;
        END LOOP;
    END LOOP;

    -- 2. The default partition: emptied at once, only when every row in it is past the retention.
    SELECT pg_catalog.count(*), pg_catalog.min(d.finished), pg_catalog.max(d.finished)
      INTO v_rows, v_oldest, v_newest
      FROM queue.history_default d;
    IF v_rows > 0 THEN
        BEGIN
            IF v_newest < v_cutoff THEN
                v_locking := 'queue.history_default';
                LOCK TABLE queue.history_default IN ACCESS EXCLUSIVE MODE;
                -- Read again under the lock: a finish may have added a row since.
                SELECT pg_catalog.count(*), pg_catalog.min(d.finished), pg_catalog.max(d.finished)
                  INTO v_rows, v_oldest, v_newest
                  FROM queue.history_default d;
            END IF;
            IF v_rows = 0 THEN
                NULL;
            ELSIF v_newest < v_cutoff AND v_policy.retention_action = 'detach' THEN
                -- Detach keeps what it retires: the rows go to a plain table, as a detached
                -- partition would, before the default is emptied.
                -- To the microsecond: two rotations in one second must not clash.
                v_name := 'history_default_' || pg_catalog.to_char(pg_catalog.clock_timestamp() AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISSUS');
                EXECUTE pg_catalog.format('CREATE TABLE queue.%I AS TABLE queue.history_default', v_name);
                EXECUTE pg_catalog.format('COMMENT ON TABLE queue.%I IS %L', v_name,
                            pg_catalog.format('Finished tasks of %s to %s UTC, copied out of queue.history_default by queue.rotate_partitions() (retention_action detach): no longer read by skiplock. Archive it, then drop it.',
                                pg_catalog.to_char(v_oldest AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'),
                                pg_catalog.to_char(v_newest AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')));
                PERFORM queue._count_dropped('queue', 'history_default');
                TRUNCATE queue.history_default;
                action := 'detached';
                partition := pg_catalog.format('queue.%I', v_name);
                detail := pg_catalog.format('%s rows of queue.history_default, finished from %s to %s UTC, all before the retention cutoff %s UTC: copied to this plain table, then the default emptied; archive it, then drop it.', v_rows,
                              pg_catalog.to_char(v_oldest AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'),
                              pg_catalog.to_char(v_newest AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'),
                              pg_catalog.to_char(v_cutoff AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'));
                RETURN NEXT;
            ELSIF v_newest < v_cutoff THEN
                PERFORM queue._count_dropped('queue', 'history_default');
                TRUNCATE queue.history_default;
                action := 'truncated';
                partition := 'queue.history_default';
                detail := pg_catalog.format('%s rows finished from %s to %s UTC, all before the retention cutoff %s UTC.', v_rows,
                              pg_catalog.to_char(v_oldest AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'),
                              pg_catalog.to_char(v_newest AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'),
                              pg_catalog.to_char(v_cutoff AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'));
                RETURN NEXT;
            ELSE
                action := 'kept';
                partition := 'queue.history_default';
                detail := pg_catalog.format('%s rows finished from %s to %s UTC; the newest is within the retention, so all are kept until every one is older than it (from %s UTC). The default partition is only ever emptied whole, never row by row.', v_rows,
                              pg_catalog.to_char(v_oldest AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'),
                              pg_catalog.to_char(v_newest AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'),
                              pg_catalog.to_char(((v_newest AT TIME ZONE 'UTC') + v_policy.retention), 'YYYY-MM-DD HH24:MI:SS'));
                RETURN NEXT;
            END IF;
        EXCEPTION
            WHEN lock_not_available THEN
                PERFORM pg_catalog.set_config('lock_timeout', '1ms', true);  -- one wait per call
                action := 'skipped: busy';
                partition := 'queue.history_default';
                detail := pg_catalog.format('Not truncated: %s is locked by %s. The next rotation tries again.',
                              v_locking, queue._lock_holders(v_locking::regclass));
                RETURN NEXT;
        END;
    END IF;

    -- 3. Partitions past the retention, oldest first; last, so that ACCESS EXCLUSIVE on
    --    queue.history is held as briefly as possible.
    FOR v_part IN
        SELECT h.schema, h.name, h.range
          FROM queue._history_partitions() h
         WHERE pg_catalog.upper(h.range) <= v_cutoff
         ORDER BY h.range
    LOOP
        BEGIN
            v_locking := 'queue.history';
            LOCK TABLE ONLY queue.history IN ACCESS EXCLUSIVE MODE;
            v_locking := 'queue.history_default';
            LOCK TABLE queue.history_default IN ACCESS EXCLUSIVE MODE;
            v_locking := pg_catalog.format('%I.%I', v_part.schema, v_part.name);
            EXECUTE pg_catalog.format('LOCK TABLE %I.%I IN ACCESS EXCLUSIVE MODE', v_part.schema, v_part.name);
            partition := pg_catalog.format('%I.%I', v_part.schema, v_part.name);
            PERFORM queue._count_dropped(v_part.schema, v_part.name);  -- queue.finished_totals keeps them
            IF v_policy.retention_action = 'drop' THEN
                EXECUTE pg_catalog.format('DROP TABLE %I.%I', v_part.schema, v_part.name);
                action := 'dropped';
                detail := pg_catalog.format('finished from %s to %s UTC, all before the retention cutoff %s UTC',
                              pg_catalog.to_char(pg_catalog.lower(v_part.range) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'),
                              pg_catalog.to_char(pg_catalog.upper(v_part.range) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'),
                              pg_catalog.to_char(v_cutoff AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'));
            ELSE
                EXECUTE pg_catalog.format('ALTER TABLE queue.history DETACH PARTITION %I.%I', v_part.schema, v_part.name);
                EXECUTE pg_catalog.format('COMMENT ON TABLE %I.%I IS %L', v_part.schema, v_part.name,
                            pg_catalog.format('Finished tasks of %s to %s UTC, detached from queue.history by queue.rotate_partitions() (retention_action detach): no longer read by skiplock. Archive it, then drop it.',
                                pg_catalog.to_char(pg_catalog.lower(v_part.range) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'),
                                pg_catalog.to_char(pg_catalog.upper(v_part.range) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI')));
                action := 'detached';
                detail := pg_catalog.format('finished from %s to %s UTC, all before the retention cutoff %s UTC; now a plain table: archive it, then drop it',
                              pg_catalog.to_char(pg_catalog.lower(v_part.range) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'),
                              pg_catalog.to_char(pg_catalog.upper(v_part.range) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'),
                              pg_catalog.to_char(v_cutoff AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'));
            END IF;
            RETURN NEXT;
        EXCEPTION
            WHEN lock_not_available THEN
                PERFORM pg_catalog.set_config('lock_timeout', '1ms', true);  -- one wait per call
                action := 'skipped: busy';
                partition := pg_catalog.format('%I.%I', v_part.schema, v_part.name);
                detail := pg_catalog.format('Not %s: %s is locked by %s. The next rotation tries again.',
                              CASE v_policy.retention_action WHEN 'drop' THEN 'dropped' ELSE 'detached' END,
                              v_locking, queue._lock_holders(v_locking::regclass));
                RETURN NEXT;
        END;
    END LOOP;

    UPDATE queue.history_policy p SET last_rotated = rotate_partitions.now WHERE p.one;
    RETURN;
END
$$;
COMMENT ON FUNCTION queue.rotate_partitions(timestamptz) IS 'Creates history partitions up to premake periods ahead, empties the default partition once all its rows are past the retention, drops or detaches expired partitions. Waits at most 100 ms for a lock, else skips this round. A row per action.';
REVOKE ALL ON FUNCTION queue.rotate_partitions(timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queue.rotate_partitions(timestamptz) TO skiplock_admin;

-- A new database starts with its partitions made: finishes go to dated partitions from the
-- first one. (Running this file again, as a later migration may, rotates once more: harmless.)
-- Not with Citus: the call runs as skiplock_owner, and Citus then refuses the migrating user's
-- ALTER TABLE on a distributed table in the same transaction; maintain() rotates there.
SELECT CASE WHEN NOT EXISTS (SELECT FROM pg_catalog.pg_extension e WHERE e.extname = 'citus')
            THEN (SELECT pg_catalog.count(*) FROM queue.rotate_partitions()) END AS rotation_actions;
