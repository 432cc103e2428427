-- The configure_stage of 0110's arguments goes (with history, and the form before history); the
-- previous revision's copy (run before this file) brought back the signature of eleven arguments.
DROP FUNCTION IF EXISTS queue.configure_stage(text, interval, integer, text, interval, interval, real, boolean, integer, integer, boolean, integer, interval, integer, boolean, integer, interval, text);
DROP FUNCTION IF EXISTS queue.configure_stage(text, interval, integer, text, interval, interval, real, boolean, integer, integer, boolean, integer, interval, integer, boolean, integer, interval);
