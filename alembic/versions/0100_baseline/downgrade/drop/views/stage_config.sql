DROP VIEW IF EXISTS queue.stage_config;
