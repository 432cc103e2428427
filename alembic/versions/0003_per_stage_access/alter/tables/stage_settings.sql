-- 0003: stage_settings.restricted (per-stage access). A constant default adds the column without
-- rewriting the table.
ALTER TABLE queue.stage_settings
    ADD COLUMN restricted boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN queue.stage_settings.restricted IS 'Whether queue.stage_access has rows for the stage (kept by grant_stage and revoke_stage): only then do enqueue and take_next look up the caller''s rights, so open stages pay nothing. grant_stage never sets it on ''*''.';
