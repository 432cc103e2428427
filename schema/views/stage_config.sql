-- What a DBA reads to see how a stage is configured, without writing anything:
-- configure_stage(stage) with no other argument writes the stage a row of its own (from then on
-- it no longer follows the defaults of '*'), and the tables behind it are not readable by the
-- application roles. The stages listed: '*', those with settings or access rows, those with live
-- tasks (_live_stages) and those schedules enqueue into. Live tasks are read only inside
-- _live_stages: on Citus a reader's filter on the stage would otherwise send the whole query,
-- that function's reads included, to a shard's node, which refuses them.
CREATE OR REPLACE VIEW queue.stage_config AS
WITH stages AS (
    SELECT s.stage FROM queue.stage_settings s
    UNION
    SELECT a.stage FROM queue.stage_access a
    UNION
    SELECT l.stage FROM queue._live_stages() AS l(stage)
    UNION
    SELECT sc.stage FROM queue.schedules sc
)
SELECT st.stage,
       own.stage IS NULL AS inherited,
       coalesce(own.paused, d.paused) AS paused,
       coalesce(own.max_running, CASE WHEN own.stage IS NULL THEN d.max_running END) AS max_running,
       coalesce(own.group_limit, CASE WHEN own.stage IS NULL THEN d.group_limit END) AS group_limit,
       coalesce(own.notify, d.notify) AS notify,
       coalesce(own.lease_duration, d.lease_duration) AS lease_duration,
       coalesce(own.max_attempts, d.max_attempts) AS max_attempts,
       coalesce(own.backoff, d.backoff) AS backoff,
       coalesce(own.backoff_base, d.backoff_base) AS backoff_base,
       coalesce(own.backoff_cap, d.backoff_cap) AS backoff_cap,
       coalesce(own.backoff_jitter, d.backoff_jitter) AS backoff_jitter,
       acc.stage IS NOT NULL AS restricted,
       coalesce(acc.enqueue_roles, '{}') AS enqueue_roles,
       coalesce(acc.take_roles, '{}') AS take_roles,
       own.updated,
       coalesce(own.rate_limit, CASE WHEN own.stage IS NULL THEN d.rate_limit END) AS rate_limit,
       coalesce(own.rate_window, d.rate_window) AS rate_window,
       coalesce(own.rate_burst, CASE WHEN own.stage IS NULL THEN d.rate_burst END) AS rate_burst,
       coalesce(own.rate_per_group, d.rate_per_group) AS rate_per_group,
       coalesce(own.weight, d.weight) AS weight,
       CASE WHEN own.stage IS NULL THEN d.task_timeout ELSE own.task_timeout END AS task_timeout,
       coalesce(own.history, 'all') AS history  -- a stage's own ('*' keeps all)
  FROM stages st
  LEFT JOIN queue.stage_settings own ON own.stage = st.stage
  LEFT JOIN queue.stage_settings d ON d.stage = '*'
  -- The roles of each restricted stage, grouped once: not three subqueries a listed stage.
  LEFT JOIN (SELECT a.stage,
                    pg_catalog.array_agg(a.role ORDER BY a.role::text) FILTER (WHERE a.may_enqueue) AS enqueue_roles,
                    pg_catalog.array_agg(a.role ORDER BY a.role::text) FILTER (WHERE a.may_take) AS take_roles
               FROM queue.stage_access a
              GROUP BY a.stage) acc ON acc.stage = st.stage
 WHERE st.stage <> ALL ((SELECT queue._hidden_stages())::text[]);  -- restricted stages the caller was not granted
COMMENT ON VIEW queue.stage_config IS 'The settings in force for each stage (its own row, or the defaults of ''*''), and who may enqueue into and take from a restricted stage. Lists ''*'', configured stages, and those with tasks or schedules. Change with configure_stage, grant_stage.';
COMMENT ON COLUMN queue.stage_config.stage IS 'Stage, or ''*'' for the defaults of every stage without a row of its own.';
COMMENT ON COLUMN queue.stage_config.inherited IS 'true: the stage has no row of its own and follows ''*'' (changes to ''*'' apply to it); false: its own row, written by configure_stage or grant_stage.';
COMMENT ON COLUMN queue.stage_config.paused IS 'While true, take_next and take_locked hand out nothing of the stage: its due tasks wait as ready.';
COMMENT ON COLUMN queue.stage_config.max_running IS 'At most this many tasks of the stage run at once; NULL: no cap.';
COMMENT ON COLUMN queue.stage_config.group_limit IS 'At most this many tasks of one group_key run at once; NULL: no cap.';
COMMENT ON COLUMN queue.stage_config.notify IS 'Whether enqueue wakes the stage''s idle workers with NOTIFY skiplock.<stage>.';
COMMENT ON COLUMN queue.stage_config.lease_duration IS 'How long a taken task stays leased without a heartbeat before reap_hung may recover it.';
COMMENT ON COLUMN queue.stage_config.max_attempts IS 'Attempts before a failing task becomes fatal.';
COMMENT ON COLUMN queue.stage_config.backoff IS 'Retry delay: linear (backoff_base * attempt) or exponential (backoff_base * 2^(attempt-1)).';
COMMENT ON COLUMN queue.stage_config.backoff_base IS 'First retry delay, the unit of the backoff.';
COMMENT ON COLUMN queue.stage_config.backoff_cap IS 'Longest retry delay.';
COMMENT ON COLUMN queue.stage_config.backoff_jitter IS 'Random spread of the retry delay, as a fraction of it.';
COMMENT ON COLUMN queue.stage_config.restricted IS 'Whether only the roles listed (and skiplock_admin) may enqueue into or take from the stage (it has rows in stage_access); false: open to every producer and worker.';
COMMENT ON COLUMN queue.stage_config.enqueue_roles IS 'Restricted stage: the roles whose members may enqueue into it (grant_stage); empty otherwise.';
COMMENT ON COLUMN queue.stage_config.take_roles IS 'Restricted stage: the roles whose members may take from it (grant_stage); empty otherwise.';
COMMENT ON COLUMN queue.stage_config.updated IS 'When the stage''s own row was last changed; NULL when inherited.';
COMMENT ON COLUMN queue.stage_config.rate_limit IS 'At most this many tasks taken per rate_window (for each group_key with rate_per_group); NULL: no limit.';
COMMENT ON COLUMN queue.stage_config.rate_window IS 'The window of rate_limit; windows start at multiples of it since the Unix epoch.';
COMMENT ON COLUMN queue.stage_config.rate_burst IS 'At most this many per rate_window * rate_burst / rate_limit; NULL: the whole rate_limit at once.';
COMMENT ON COLUMN queue.stage_config.rate_per_group IS 'Whether rate_limit applies to each group_key rather than to the stage.';
COMMENT ON COLUMN queue.stage_config.weight IS 'Tasks a multi-stage take serves from the stage in its turn.';
COMMENT ON COLUMN queue.stage_config.task_timeout IS 'How long a worker lets one attempt run before it kills it and fails the attempt; NULL: no limit.';
COMMENT ON COLUMN queue.stage_config.history IS 'What queue.history keeps of the stage''s ended tasks: all, failures (fatal ends) or none; the runs not kept are counted (queue.finished_counts).';
REVOKE ALL ON queue.stage_config FROM PUBLIC;
GRANT SELECT ON queue.stage_config TO skiplock_monitor, skiplock_admin;
