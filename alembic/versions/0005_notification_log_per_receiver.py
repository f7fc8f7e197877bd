"""notification log per receiver and alert group (replaces alerts.notified_state)

What was notified used to be one state per alert, shared by every receiver and set even
when no notification went out. The log keeps, per (receiver, group), the fingerprints last
sent as firing and when. The upgrade seeds it from the old column: for every (receiver,
group) that was ever notified, the alerts then marked notified-as-firing that the
receiver's ``match`` routes to it, at the time of its latest notification.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-12 10:00:00.000000
"""
import sqlalchemy as sa

from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

alerts = sa.table('alerts', sa.column('fingerprint', sa.String), sa.column('labels', sa.JSON),
                  sa.column('group_key', sa.Text), sa.column('notified_state', sa.String))
notifications = sa.table('notifications', sa.column('receiver', sa.String), sa.column('group_key', sa.Text),
                         sa.column('created_at', sa.Float))
receivers = sa.table('receivers', sa.column('name', sa.String), sa.column('config', sa.JSON))
log = sa.table('notification_log', sa.column('receiver', sa.String), sa.column('group_key', sa.Text),
               sa.column('firing', sa.JSON), sa.column('sent_at', sa.Float))


def upgrade() -> None:
    op.create_table('notification_log',
    sa.Column('receiver', sa.String(length=64), nullable=False),
    sa.Column('group_key', sa.Text(), nullable=False),
    sa.Column('firing', sa.JSON(), nullable=False),
    sa.Column('sent_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('receiver', 'group_key')
    )
    conn = op.get_bind()
    match = {name: (config or {}).get('match') or {}
             for name, config in conn.execute(sa.select(receivers.c.name, receivers.c.config))}
    notified = conn.execute(sa.select(alerts.c.fingerprint, alerts.c.labels, alerts.c.group_key)
                            .where(alerts.c.notified_state == 'firing')).all()
    last = conn.execute(sa.select(notifications.c.receiver, notifications.c.group_key,
                                  sa.func.max(notifications.c.created_at))
                        .group_by(notifications.c.receiver, notifications.c.group_key)).all()
    rows = [{'receiver': receiver, 'group_key': group, 'sent_at': sent_at,
             'firing': sorted(fp for fp, labels, gk in notified if gk == group
                              and all(labels.get(k) == v for k, v in match[receiver].items()))}
            for receiver, group, sent_at in last if receiver in match]
    if rows:
        conn.execute(log.insert(), rows)
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.drop_column('notified_state')


def downgrade() -> None:
    """Adds ``notified_state`` back, set to 'firing' for every alert that some receiver's
    log lists as told firing, and NULL for all others: 'resolved' is not restored (the log
    keeps no resolutions), so an alert notified as resolved comes back as never notified.
    What each receiver was told, and when, is dropped with the log."""
    with op.batch_alter_table('alerts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('notified_state', sa.String(length=10), nullable=True))
    conn = op.get_bind()
    told = {fp for (firing,) in conn.execute(sa.select(log.c.firing)) for fp in firing}
    if told:
        conn.execute(alerts.update().where(alerts.c.fingerprint.in_(sorted(told))).values(notified_state='firing'))
    op.drop_table('notification_log')
