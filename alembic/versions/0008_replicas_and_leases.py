"""replicas and leases: more than one replica of the service on one PostgreSQL database

``replicas`` holds one row per running replica with its heartbeat (live replicas share the
targets by rendezvous hashing); ``leases`` holds the leader lease (holder, fencing token,
expiry) of the replica that runs the diagnosis and alert rounds and delivers notifications.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 17:50:00.000000
"""
import sqlalchemy as sa

from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'replicas',
        sa.Column('id', sa.String(64), primary_key=True),
        sa.Column('host', sa.String(255), nullable=False),
        sa.Column('pid', sa.Integer(), nullable=False),
        sa.Column('started_at', sa.Float(), nullable=False),
        sa.Column('heartbeat_at', sa.Float(), nullable=False),
    )
    op.create_table(
        'leases',
        sa.Column('name', sa.String(32), primary_key=True),
        sa.Column('holder', sa.String(64), nullable=False),
        sa.Column('token', sa.Integer(), nullable=False),
        sa.Column('expires_at', sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table('leases')
    op.drop_table('replicas')
