"""orders stage (recipe 2: depends on skiplock's revision 0100, the baseline)

Revision ID: app0003
Revises: app0002
"""
# An application revision that calls skiplock's API. In one history, depends_on names the
# skiplock revision that brought what it uses (queue.configure_stage: 0100, the baseline): Alembic then runs
# that revision, and all before it, first. Give a revision id, not 'skiplock@head' (see
# docs/embedding.md).
from alembic import op

revision = 'app0003'
down_revision = 'app0002'
branch_labels = None
depends_on = '0100'


def upgrade() -> None:
    op.execute("SELECT queue.configure_stage('orders', max_attempts => 8)")


def downgrade() -> None:
    pass  # a stage's settings outlive the revision that set them
