"""discovered targets: where a target came from, and when it disappeared

Targets can now come from service discovery (``file_sd``/``http_sd`` in scrape mode) and
from Prometheus sources, besides the YAML file and the API. ``source`` widens to hold
``file_sd``, ``http_sd`` and ``prometheus``; ``origin`` names the discovery config or the
Prometheus source a target belongs to; ``gone_at`` marks a discovered target whose series
or discovery entry disappeared (scale-down, rollout) so it is kept for its history but no
longer scraped, alerted on as down, or listed as live.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 15:00:00.000000
"""
import sqlalchemy as sa

from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('targets', schema=None) as batch_op:
        batch_op.alter_column('source', existing_type=sa.String(8), type_=sa.String(16),
                              existing_nullable=False)
        batch_op.add_column(sa.Column('origin', sa.String(128), nullable=True))
        batch_op.add_column(sa.Column('gone_at', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('targets', schema=None) as batch_op:
        batch_op.drop_column('gone_at')
        batch_op.drop_column('origin')
        batch_op.alter_column('source', existing_type=sa.String(16), type_=sa.String(8),
                              existing_nullable=False)
