-- configure_stage gains rate_limit, rate_window, rate_burst, rate_per_group and weight: the
-- signature of eleven arguments goes before the new one is created. Calls by name (as the docs
-- write them) and by position of up to eleven arguments reach the new one unchanged.
-- squawk-ignore ban-drop-function
DROP FUNCTION IF EXISTS queue.configure_stage(text, interval, integer, text, interval, interval, real, boolean, integer, integer, boolean);
