-- configure_stage gains rate_limit, rate_window, rate_burst, rate_per_group and weight: the
-- signature of eleven arguments goes before the new one is created (one function, named calls
-- such as configure_stage('s', max_running => 3) stay valid).
DROP FUNCTION queue.configure_stage(text, interval, integer, text, interval, interval, real, boolean, integer, integer, boolean);
