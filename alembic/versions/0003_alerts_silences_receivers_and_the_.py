"""alerts, silences, receivers and the notification outbox

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 17:57:41.665960
"""
import sqlalchemy as sa

from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('alerts',
    sa.Column('fingerprint', sa.String(length=16), nullable=False),
    sa.Column('alertname', sa.String(length=128), nullable=False),
    sa.Column('labels', sa.JSON(), nullable=False),
    sa.Column('annotations', sa.JSON(), nullable=False),
    sa.Column('state', sa.String(length=10), nullable=False),
    sa.Column('group_key', sa.Text(), nullable=False),
    sa.Column('active_since', sa.Float(), nullable=False),
    sa.Column('starts_at', sa.Float(), nullable=True),
    sa.Column('ends_at', sa.Float(), nullable=True),
    sa.Column('last_evaluated', sa.Float(), nullable=False),
    sa.Column('value', sa.Float(), nullable=True),
    sa.Column('notified_state', sa.String(length=10), nullable=True),
    sa.PrimaryKeyConstraint('fingerprint')
    )
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.create_index('ix_alerts_group', ['group_key'], unique=False)
        batch_op.create_index('ix_alerts_state', ['state'], unique=False)

    op.create_table('notifications',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('receiver', sa.String(length=64), nullable=False),
    sa.Column('group_key', sa.Text(), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=10), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('state', sa.String(length=10), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('next_attempt_at', sa.Float(), nullable=False),
    sa.Column('delivered_at', sa.Float(), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.create_index('ix_notifications_due', ['state', 'next_attempt_at'], unique=False)
        batch_op.create_index('ix_notifications_group', ['receiver', 'group_key', 'seq'], unique=False)

    op.create_table('receivers',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('source', sa.String(length=8), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('silences',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('matchers', sa.JSON(), nullable=False),
    sa.Column('starts_at', sa.Float(), nullable=False),
    sa.Column('ends_at', sa.Float(), nullable=False),
    sa.Column('created_by', sa.String(length=128), nullable=False),
    sa.Column('comment', sa.Text(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('delivery_attempts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('notification_id', sa.String(length=36), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('ts', sa.Float(), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.Column('latency', sa.Float(), nullable=False),
    sa.Column('response', sa.Text(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['notification_id'], ['notifications.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('delivery_attempts', schema=None) as batch_op:
        batch_op.create_index('ix_attempts_notification', ['notification_id'], unique=False)




def downgrade() -> None:

    with op.batch_alter_table('delivery_attempts', schema=None) as batch_op:
        batch_op.drop_index('ix_attempts_notification')

    op.drop_table('delivery_attempts')
    op.drop_table('silences')
    op.drop_table('receivers')
    with op.batch_alter_table('notifications', schema=None) as batch_op:
        batch_op.drop_index('ix_notifications_group')
        batch_op.drop_index('ix_notifications_due')

    op.drop_table('notifications')
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.drop_index('ix_alerts_state')
        batch_op.drop_index('ix_alerts_group')

    op.drop_table('alerts')

