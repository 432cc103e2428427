"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
"""
# Write revisions with `make revision m="..."`: it freezes the changed schema/ files beside them.
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    raise NotImplementedError


def downgrade() -> None:
    raise NotImplementedError
