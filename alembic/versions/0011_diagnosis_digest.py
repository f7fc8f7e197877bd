"""Diagnoses carry a digest of their details

The status page and ``/api/v1/diagnoses`` read every target's latest diagnosis; fetching and
decoding every one's details (4-5 KB each) for each read was most of what those reads cost at
1,000 targets. With the digest (and the evaluation it was written with) a reader fetches only
the details it has not decoded yet. Existing rows get none and are read in full until their
next evaluation.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 05:00:00.000000
"""
import sqlalchemy as sa

from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('diagnoses') as batch:
        batch.add_column(sa.Column('digest', sa.String(length=32), nullable=True))
        batch.add_column(sa.Column('digest_at', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('diagnoses') as batch:
        batch.drop_column('digest_at')
        batch.drop_column('digest')
