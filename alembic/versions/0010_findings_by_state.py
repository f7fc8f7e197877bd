"""Findings by state: an index for the reads of every target's open findings

The status page, ``/api/v1/diagnoses`` and every diagnosis round read the pending and
active findings of all targets; resolved findings stay as history, so without this index
each of those reads scanned the whole history.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 23:30:00.000000
"""
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_findings_state', 'findings', ['state'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_findings_state', table_name='findings')
