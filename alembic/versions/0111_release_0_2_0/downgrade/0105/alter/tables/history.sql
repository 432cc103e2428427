-- Back to 0104: the CHECK on history.status (validated against the rows written since).
ALTER TABLE queue.history
    ADD CONSTRAINT history_status_final CHECK (status IN ('done', 'fatal', 'cancelled'));
