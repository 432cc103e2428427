"""orders

Revision ID: app0001
Revises:
"""
# The application's first revision: its own branch label, so that `alembic upgrade app@head`
# names it even when skiplock's branch shares the history (recipe 2).
# Revision ids must not collide with skiplock's ('0100', '0101', …): prefix yours.
from alembic import op

revision = 'app0001'
down_revision = None
branch_labels = ('app',)
depends_on = None


def upgrade() -> None:
    op.execute("CREATE SCHEMA app")
    op.execute("""
        CREATE TABLE app.orders (
            id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            customer text NOT NULL,
            placed   timestamptz NOT NULL DEFAULT now()
        )""")


def downgrade() -> None:
    op.execute("DROP TABLE app.orders")
    op.execute("DROP SCHEMA app")
