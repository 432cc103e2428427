DROP TYPE IF EXISTS queue.cron_fields;
