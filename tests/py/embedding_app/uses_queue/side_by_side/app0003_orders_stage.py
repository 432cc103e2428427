"""orders stage (recipe 1: needs `skiplock upgrade` to have run first)

Revision ID: app0003
Revises: app0002
"""
# An application revision that calls skiplock's API. Side by side, Alembic knows nothing of
# skiplock's history, so nothing here can say "after skiplock": the deploy does, by running
# `skiplock upgrade` before `alembic upgrade head` (or env.py's skiplock_first hook).
from alembic import op

revision = 'app0003'
down_revision = 'app0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("SELECT queue.configure_stage('orders', max_attempts => 8)")


def downgrade() -> None:
    pass  # a stage's settings outlive the revision that set them
