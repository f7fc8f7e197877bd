"""More than one replica of the service on one database: membership, target ownership, the leader.

* **Membership.** Every replica has a row in ``replicas`` and renews its ``heartbeat_at``
  every ``replica_heartbeat`` seconds; the live replicas are those whose heartbeat is
  fresher than ``replica_expiry``. A clean shutdown deletes the row, so the others take
  over at their next heartbeat instead of after the expiry.
* **Targets** are spread by rendezvous (highest random weight) hashing: the owner of a
  target is the live replica with the highest ``hash(replica, target)``. Every replica
  computes the same answer from the same live set, with no coordination, and a replica
  joining or leaving moves only the targets it gains or loses (about 1/N of them).
  Hand-over (:class:`Ownership`): a replica drops a target the moment its view says another
  owns it, and takes a target at once when its previous owner is dead or gone (first
  scrape immediately), but waits 1.5 heartbeats when the previous owner is still live (a
  replica that just joined), so that owner has seen the new member and dropped the target
  first. A replica whose event loop is too busy to drop a target's job in time is still
  fenced: right before each scrape and before its result is queued for writing, the scrape
  service asks :meth:`Ownership.holds`, which answers from the heartbeat thread's latest
  view (:attr:`Membership.view`) and says no once that view is older than the hand-over
  wait (the newcomer may have taken the target since). So no target is scraped by two
  replicas, and none goes unscraped for longer than 2 scrape intervals + ``replica_expiry``
  when its replica is killed (docs/operations.md#failover).
* **The leader** (:class:`Lease`) holds the ``leader`` row of ``leases`` (holder, fencing
  token, expiry) and runs what must happen once per fleet: the diagnosis and alert rounds,
  notification delivery and retention. The lease lasts ``replica_expiry`` and is renewed
  every heartbeat; an expired lease is taken over with the token incremented. Every
  transaction of a leader round, just before it commits, takes a shared row lock on the
  lease and checks this replica still holds it with its token (:meth:`Lease.fence`): a
  takeover's ``UPDATE`` waits for a commit of the old leader in progress, and a deposed
  leader's transaction is rolled back instead of committed, so two leaders never both
  write alert state or notifications. The lock is held only for the commit, so a long
  round never delays a renewal or a takeover.
* **One clock.** Heartbeats, expiries and the lease are judged by the database's clock
  (:func:`database_now`, read in the same transaction that writes them), never by a replica's
  own: replicas whose clocks disagree still agree on who is live and who leads. A replica's
  own clock only measures its local ages (how old its view is, when its lease runs out).
* **SQLite** serves one replica: :func:`lock_sqlite_file` takes an exclusive lock on a file
  next to the database and refuses to start a second process on it, naming the holder.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Connection, delete, event, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.store.db import NOT_A_CHANGE
from app.store.models import LeaseRow, ReplicaRow

log = logging.getLogger(__name__)
LEADER = "leader"
FORGET_AFTER = 10  # expiries: a dead replica's row is deleted after this many (it is not live long before)


class SecondReplicaRefused(RuntimeError):
    """A second process on one SQLite file."""


class NotLeader(RuntimeError):
    """A leader round's transaction found the lease held by another replica (or expired)."""


def database_now(connection: Connection) -> float:
    """The shared clock of the replicas: PostgreSQL's ``clock_timestamp()`` (unix seconds). SQLite
    serves one process, whose own clock it is."""
    if connection.dialect.name == "postgresql":
        return float(connection.execute(text("SELECT extract(epoch FROM clock_timestamp())::float8")).scalar_one())
    return time.time()


#: How a replica reads the shared clock inside a transaction (tests simulate it).
SharedClock = Callable[[Connection], float]


def default_replica_id() -> str:
    """``<host>-<pid>-<random>``: unique even when a restarted pod reuses host and pid."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(3)}"


def weight(replica: str, target: str) -> int:
    """The rendezvous weight of ``target`` on ``replica`` (stable across processes and hosts)."""
    return int.from_bytes(hashlib.blake2b(f"{replica}\0{target}".encode(), digest_size=8).digest(), "big")


def owner(target: str, replicas: Iterable[str]) -> str | None:
    """The replica that scrapes ``target``: the highest weight (ties broken by id); None without replicas."""
    return max(replicas, key=lambda r: (weight(r, target), r), default=None)


class Ownership:
    """Which targets this replica scrapes, with the hand-over rule of the module docstring.

    :meth:`update` is called every heartbeat with the target names and the live replicas;
    it returns the targets owned now and, of those, the ones taken over from a dead or
    departed replica (scraped at once rather than at their usual offset)."""

    def __init__(self, me: str, handover: float) -> None:
        self.me = me
        self.handover = handover
        self.owned: set[str] = set()
        self.waiting: dict[str, float] = {}  # target -> when it may be taken from a live previous owner
        self._previous: tuple[str, ...] | None = None

    def update(self, targets: Iterable[str], live: Sequence[str], now: float) -> tuple[set[str], set[str]]:
        live_set = set(live) | {self.me}
        previous = self._previous if self._previous is not None else tuple(r for r in live_set if r != self.me)
        owned: set[str] = set()
        taken_over: set[str] = set()
        waiting: dict[str, float] = {}
        for target in targets:
            if owner(target, live_set) != self.me:
                continue
            if target in self.owned:
                owned.add(target)
                continue
            if target in self.waiting:  # a hand-over in progress
                if now >= self.waiting[target]:
                    owned.add(target)
                    taken_over.add(target)
                else:
                    waiting[target] = self.waiting[target]
                continue
            before = owner(target, previous)
            if before is None or before == self.me:
                owned.add(target)  # new target, or first start with nobody else: the usual spread offset
            elif before not in live_set:
                owned.add(target)  # its replica is dead or gone: scrape it now
                taken_over.add(target)
            else:
                waiting[target] = now + self.handover  # its owner drops it at its next heartbeat
        self.owned, self.waiting, self._previous = owned, waiting, tuple(sorted(live_set))
        return owned, taken_over

    def next_change_at(self) -> float | None:
        """When a waiting target may be taken (the heartbeat loop wakes up for it)."""
        return min(self.waiting.values(), default=None)

    def holds(self, target: str, view: tuple[float, tuple[str, ...]], now: float) -> bool:
        """Whether this replica may scrape ``target`` and write its result now, from ``view``
        (:attr:`Membership.view`: when the last heartbeat began, and the live set it read),
        not from :attr:`owned`, which the event loop updates and may be late with.

        The fence: a replica that joins waits :attr:`handover` after it first sees a live
        previous owner before it takes that owner's targets, so a view begun less than
        ``handover`` ago cannot have missed a newcomer that took one already. An older view
        (heartbeats failing or late) holds nothing."""
        began, live = view
        return now - began < self.handover and owner(target, set(live) | {self.me}) == self.me


class Membership:
    """This replica's row in ``replicas`` and the live set as of its last heartbeat."""

    def __init__(self, sessions: sessionmaker[Session], replica_id: str, expiry: float,
                 clock: Callable[[], float] = time.time, shared_clock: SharedClock = database_now) -> None:
        """``clock``: this replica's own (local ages); ``shared_clock``: the rows' (:func:`database_now`)."""
        self.sessions = sessions
        self.id = replica_id
        self.expiry = expiry
        self.clock = clock
        self.shared_clock = shared_clock
        self.host = socket.gethostname()[:255]
        self.pid = os.getpid()
        self.started_at = clock()
        self.live: tuple[str, ...] = (replica_id,)
        #: (when the last successful heartbeat began, the live replicas it read); one assignment,
        #: read by the scrape path's ownership check (:meth:`Ownership.holds`) from any thread
        self.view: tuple[float, tuple[str, ...]] = (-math.inf, self.live)

    def beat(self) -> tuple[str, ...]:
        """Renew (or re-create) this replica's row and return the live replicas, sorted."""
        began = self.clock()
        with self.sessions.begin() as session:
            session.connection(execution_options={NOT_A_CHANGE: True})  # liveness reaches answers by age
            now = self.shared_clock(session.connection())
            row = session.get(ReplicaRow, self.id)
            if row is None:
                session.add(ReplicaRow(id=self.id, host=self.host, pid=self.pid, started_at=self.started_at,
                                       heartbeat_at=now))
            else:
                row.heartbeat_at = now
            session.execute(delete(ReplicaRow).where(ReplicaRow.heartbeat_at < now - FORGET_AFTER * self.expiry))
            session.flush()
            live = session.scalars(select(ReplicaRow.id).where(ReplicaRow.heartbeat_at > now - self.expiry)).all()
        self.live = tuple(sorted(set(live) | {self.id}))
        self.view = (began, self.live)  # as of the beat's start: a replica joining later is seen next time
        return self.live

    def leave(self) -> None:
        """Delete this replica's row: the others take its targets at their next heartbeat."""
        with self.sessions.begin() as session:
            session.execute(delete(ReplicaRow).where(ReplicaRow.id == self.id))

    def rows(self) -> list[ReplicaRow]:
        with self.sessions() as session:
            rows = list(session.scalars(select(ReplicaRow).order_by(ReplicaRow.id)))
            session.expunge_all()
            return rows


#: The expiry of a lease given up at a clean stop (:meth:`Lease.release`): the epoch, long past.
RELEASED = 0.0


class Lease:
    """The ``leader`` lease: acquire, renew, take over when expired, release, fence."""

    def __init__(self, sessions: sessionmaker[Session], holder: str, ttl: float, name: str = LEADER,
                 clock: Callable[[], float] = time.time, shared_clock: SharedClock = database_now) -> None:
        """``clock``: this replica's own; ``shared_clock``: the lease row's (:func:`database_now`)."""
        self.sessions = sessions
        self.holder = holder
        self.ttl = ttl
        self.name = name
        self.clock = clock
        self.shared_clock = shared_clock
        self.token: int | None = None  # set while this replica holds the lease
        self.expires_at = 0.0  # on this replica's clock: a ttl after the renewal began

    @property
    def held(self) -> bool:
        return self.token is not None and self.clock() < self.expires_at

    def renew(self) -> bool:
        """Acquire, renew or take over the lease; returns whether this replica holds it now."""
        began = self.clock()
        try:
            with self.sessions.begin() as session:
                session.connection(execution_options={NOT_A_CHANGE: True})  # liveness reaches answers by age
                if session.get_bind().dialect.name == "postgresql":  # never wait long for a committing round
                    session.execute(text(f"SET LOCAL lock_timeout = '{max(100, int(self.ttl * 200))}ms'"))
                row = session.get(LeaseRow, self.name, with_for_update=True)
                now = self.shared_clock(session.connection())  # after the row lock: a takeover waited for it
                if row is None:
                    row = LeaseRow(name=self.name, holder=self.holder, token=1, expires_at=now + self.ttl)
                    session.add(row)
                elif row.holder == self.holder and row.token == self.token:
                    row.expires_at = now + self.ttl  # ours, and nobody took it over since
                elif row.expires_at <= now:
                    if row.expires_at <= RELEASED:  # given up at a clean stop: nothing went wrong
                        log.info("taking the leader lease %s released at its stop", row.holder)
                    elif row.holder != self.holder:
                        log.warning("taking over the leader lease from %s (expired %.1fs ago)", row.holder,
                                    now - row.expires_at)
                    row.holder, row.token, row.expires_at = self.holder, row.token + 1, now + self.ttl
                else:
                    self.token = None
                    return False
                token = row.token
        except IntegrityError:  # another replica created the row first
            self.token = None
            return False
        if self.token != token:
            log.info("this replica (%s) leads, fencing token %d", self.holder, token)
        self.token, self.expires_at = token, began + self.ttl
        return True

    def release(self) -> None:
        """Give the lease up (clean shutdown): the next replica takes it at its next heartbeat."""
        if self.token is None:
            return
        with self.sessions.begin() as session:
            row = session.get(LeaseRow, self.name, with_for_update=True)
            if row is not None and row.holder == self.holder and row.token == self.token:
                row.expires_at = RELEASED
        self.token = None

    def current(self) -> LeaseRow | None:
        with self.sessions() as session:
            row = session.get(LeaseRow, self.name)
            if row is not None:
                session.expunge(row)
            return row

    def fence(self, connection: Any) -> None:
        """Last statement before a leader round's commit: share-lock the lease row (a takeover
        waits for this commit) and check this replica still holds it, else raise (rollback)."""
        table = LeaseRow.__table__
        query = select(table.c.holder, table.c.token, table.c.expires_at).where(table.c.name == self.name)
        if connection.dialect.name == "postgresql":
            query = query.with_for_update(read=True)
        row = connection.execute(query).first()
        now = self.shared_clock(connection) if row is not None else 0.0
        if row is None or row.holder != self.holder or row.token != self.token or row.expires_at <= now:
            raise NotLeader(f"replica {self.holder} no longer holds the {self.name} lease "
                            f"(token {self.token}, lease now {tuple(row) if row else 'absent'})")

    def fenced_sessions(self, sessions: sessionmaker[Session]) -> sessionmaker[Session]:
        """A sessionmaker like ``sessions`` whose every commit is preceded by :meth:`fence`
        (reads need no fence: only what a deposed leader would write does harm)."""
        fenced: sessionmaker[Session] = sessionmaker(sessions.kw["bind"], expire_on_commit=False)

        @event.listens_for(fenced, "before_commit")
        def _fence(session: Session) -> None:
            self.fence(session.connection())

        return fenced


def lock_sqlite_file(url: str, replica_id: str) -> IO[str] | None:
    """Refuse a second process on one SQLite file: hold an exclusive ``flock`` on
    ``<database>.replica-lock`` for the life of the process (the kernel drops it when the
    process dies, even by kill -9). Returns the open lock file (keep it; closing releases),
    or None for an in-memory database or a server database."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    path = Path(parsed.database + ".replica-lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")  # held open for the life of the process
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise SecondReplicaRefused(
            f"refusing to start: {holder} already runs on the SQLite database {parsed.database}. "
            "SQLite serves one replica (one writer, and no shared leader lease across hosts); "
            "run more than one replica on PostgreSQL (LLM_LATENCY_DATABASE_URL=postgresql+psycopg://...)"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"replica {replica_id} (pid {os.getpid()} on host {socket.gethostname()}, "
                 f"since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())})\n")
    handle.flush()
    return handle
