DROP TABLE IF EXISTS queue.reaper_clock;
