"""order events

Revision ID: app0002
Revises: app0001
"""
from alembic import op

revision = 'app0002'
down_revision = 'app0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE app.order_events (
            id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            order_id bigint NOT NULL REFERENCES app.orders (id),
            event    text NOT NULL,
            at       timestamptz NOT NULL DEFAULT now()
        )""")


def downgrade() -> None:
    op.execute("DROP TABLE app.order_events")
