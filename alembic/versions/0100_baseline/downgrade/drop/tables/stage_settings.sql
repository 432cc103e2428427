DROP TABLE IF EXISTS queue.stage_settings;
