"""Change events: what happened to each target, and what its detector remembers

``change_events`` holds restarts, configuration changes, replica-set changes and load or
workload steps (app/attribution/events.py); ``change_detectors`` one JSON row per target with
the detector's memory between rounds (its last configuration and replicas, its change-point
tests' state) and the end of the last window it read.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 09:00:00.000000
"""
import sqlalchemy as sa

from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'change_events',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('target_id', sa.Integer(), nullable=False),
        sa.Column('ts', sa.Float(), nullable=False),
        sa.Column('kind', sa.String(length=12), nullable=False),
        sa.Column('subject', sa.String(length=256), nullable=False),
        sa.Column('before', sa.Text(), nullable=True),
        sa.Column('after', sa.Text(), nullable=True),
        sa.Column('summary', sa.Text(), nullable=False),
        sa.Column('detected_at', sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(['target_id'], ['targets.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_change_events_target_ts', 'change_events', ['target_id', 'ts'], unique=False)
    op.create_table(
        'change_detectors',
        sa.Column('target_id', sa.Integer(), nullable=False),
        sa.Column('read_until', sa.Float(), nullable=False),
        sa.Column('state', sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(['target_id'], ['targets.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('target_id'),
    )


def downgrade() -> None:
    op.drop_table('change_detectors')
    op.drop_index('ix_change_events_target_ts', table_name='change_events')
    op.drop_table('change_events')
