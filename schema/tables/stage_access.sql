CREATE TABLE queue.stage_access (
    stage        text    NOT NULL
                         CONSTRAINT stage_access_stage_named CHECK (octet_length(stage) BETWEEN 1 AND 54 AND stage <> '*'),
    role         regrole NOT NULL,
    may_enqueue  boolean NOT NULL DEFAULT true,
    may_take     boolean NOT NULL DEFAULT true,
    CONSTRAINT stage_access_pkey PRIMARY KEY (stage, role)
);

COMMENT ON TABLE queue.stage_access IS 'Per-stage access (tenants): a stage with rows here is restricted to members of the listed roles with the matching right, and of skiplock_admin. Change with grant_stage() and revoke_stage(); stage_settings.restricted mirrors it.';
COMMENT ON COLUMN queue.stage_access.stage IS 'The restricted stage.';
COMMENT ON COLUMN queue.stage_access.role IS 'A role (usually a tenant''s group role) whose members get the rights below. A dropped role''s row grants nobody anything; delete it with revoke_stage before dropping the role.';
COMMENT ON COLUMN queue.stage_access.may_enqueue IS 'Members may call enqueue and enqueue_batch for the stage.';
COMMENT ON COLUMN queue.stage_access.may_take IS 'Members may call take_next for the stage (and so get the leases that heartbeat, finish, fail and release require).';
