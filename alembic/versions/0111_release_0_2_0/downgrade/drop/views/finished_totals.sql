DROP VIEW IF EXISTS queue.finished_totals;
