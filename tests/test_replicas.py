"""Replicas (app/replicas/membership.py): rendezvous ownership and its hand-over rule, the leader lease and
its fencing on a real PostgreSQL, and the refusal of a second process on one SQLite file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from app.replicas import membership as replicas
from app.replicas.membership import (
    Lease,
    Membership,
    NotLeader,
    Ownership,
    SecondReplicaRefused,
    lock_sqlite_file,
    owner,
)
from app.settings import Settings
from app.store import db
from app.store.models import Target
from tests.conftest import scratch_postgres_database
from tests.support.databases import migrated_sqlite
from tests.support.prometheus import free_port

ROOT = Path(__file__).resolve().parents[1]
TARGETS = [f"vllm-{i}" for i in range(300)]


def test_rendezvous_spreads_targets_and_moves_only_the_leavers_share() -> None:
    three = ["r-a", "r-b", "r-c"]
    before = {t: owner(t, three) for t in TARGETS}
    counts = Counter(before.values())
    assert set(counts) == set(three) and all(70 <= n <= 130 for n in counts.values()), counts
    assert {t: owner(t, list(reversed(three))) for t in TARGETS} == before  # order of the live list is irrelevant
    after = {t: owner(t, ["r-a", "r-c"]) for t in TARGETS}  # r-b leaves
    moved = {t for t in TARGETS if after[t] != before[t]}
    assert moved == {t for t in TARGETS if before[t] == "r-b"}
    joined = {t: owner(t, [*three, "r-d"]) for t in TARGETS}  # r-d joins: it only gains
    gained = {t for t in TARGETS if joined[t] != before[t]}
    assert all(joined[t] == "r-d" for t in gained) and 40 <= len(gained) <= 110
    assert owner("x", []) is None


def test_hand_over_waits_for_a_live_owner_and_takes_a_dead_ones_targets_at_once() -> None:
    a, b = Ownership("r-a", handover=1.5), Ownership("r-b", handover=1.5)
    owned_a, taken = a.update(TARGETS, ["r-a"], now=0.0)
    assert owned_a == set(TARGETS) and taken == set()  # alone: everything, at the usual offsets
    # r-b joins: it waits 1.5 s for targets r-a still scrapes; r-a drops them at its next heartbeat
    owned_b, taken = b.update(TARGETS, ["r-a", "r-b"], now=10.0)
    assert owned_b == set() and b.next_change_at() == 11.5
    share_b = {t for t in TARGETS if owner(t, ["r-a", "r-b"]) == "r-b"}
    owned_a, _ = a.update(TARGETS, ["r-a", "r-b"], now=10.5)
    assert owned_a == set(TARGETS) - share_b
    assert b.update(TARGETS, ["r-a", "r-b"], now=11.0) == (set(), set())
    owned_b, taken = b.update(TARGETS, ["r-a", "r-b"], now=11.5)
    assert owned_b == share_b == taken and b.next_change_at() is None
    assert owned_a & owned_b == set() and owned_a | owned_b == set(TARGETS)
    # r-a dies (its heartbeat expires): r-b takes its targets at once and scrapes them now
    owned_b, taken = b.update(TARGETS, ["r-b"], now=20.0)
    assert owned_b == set(TARGETS) and taken == set(TARGETS) - share_b
    # a target added later is just owned (usual offset), a removed one dropped
    owned_b, taken = b.update([*TARGETS[1:], "new"], ["r-b"], now=21.0)
    assert "new" in owned_b and TARGETS[0] not in owned_b and taken == set()


def test_settings_refuse_an_expiry_shorter_than_two_heartbeats() -> None:
    with pytest.raises(ValidationError, match="replica_expiry must be at least twice replica_heartbeat"):
        Settings(replica_heartbeat=5, replica_expiry=8)
    assert Settings(replica_heartbeat="1s", replica_expiry="2s").replica_expiry == 2.0


def test_leader_lease_takeover_and_fencing_on_postgresql() -> None:
    with scratch_postgres_database() as database:
        db.upgrade(database.url)
        engine = db.make_engine(database.url)
        sessions = db.make_sessionmaker(engine)
        clock = {"now": 1000.0}
        a = Lease(sessions, "r-a", ttl=3.0, clock=lambda: clock["now"], shared_clock=lambda _: clock["now"])
        b = Lease(sessions, "r-b", ttl=3.0, clock=lambda: clock["now"], shared_clock=lambda _: clock["now"])
        try:
            assert a.renew() and a.token == 1 and not b.renew() and b.token is None
            clock["now"] += 2.0
            assert a.renew() and a.token == 1  # renewed, same token
            fenced_a = a.fenced_sessions(sessions)
            with fenced_a.begin() as session:  # the holder's commits pass the fence
                session.add(Target(name="written-by-the-leader", url="http://127.0.0.1:1/metrics", created_at=1.0,
                                   updated_at=1.0))
            clock["now"] += 3.5  # a missed its renewals: b takes over with the next token
            assert b.renew() and b.token == 2
            assert not a.renew() and a.token is None and not a.held
            with pytest.raises(NotLeader, match="r-a no longer holds the leader lease"):
                with fenced_a.begin() as session:
                    session.add(Target(name="written-by-a-deposed-leader", url="http://127.0.0.1:1/metrics",
                                       created_at=1.0, updated_at=1.0))
            with sessions() as session:  # nothing of the deposed leader was written
                assert session.scalars(select(Target.name)).all() == ["written-by-the-leader"]
            # a takeover waits for a commit of the holder in progress (the fence's row lock)
            with sessions.begin() as session:
                b.fence(session.connection())  # what a fenced commit does first: FOR SHARE on the lease row
                clock["now"] += 10.0  # b's lease has expired meanwhile; a tries to take over
                with pytest.raises(OperationalError, match="lock timeout"):
                    a.renew()  # waits (lock_timeout: a fraction of the lease) instead of overtaking the commit
            assert a.renew() and a.token == 3  # b's commit is over
            b.release()  # not the holder any more: leaves a's lease alone
            current = a.current()
            assert current is not None and current.holder == "r-a"
            a.release()
            assert b.renew() and b.token == 4  # a released lease is taken at once
        finally:
            engine.dispose()


def test_replicas_whose_clocks_disagree_by_a_minute_agree_on_owners_and_the_leader() -> None:
    """Two replicas on one PostgreSQL, one's clock 60 s behind the other's: heartbeats, expiries and
    the lease are judged on the database's clock, so each sees the other live, every target has
    one owner, and exactly one leads (a skew past the expiry made both scrape 95 of 200 targets)."""
    skew = 60.0
    with scratch_postgres_database() as database:
        db.upgrade(database.url)
        engine = db.make_engine(database.url)
        sessions = db.make_sessionmaker(engine)
        clocks = {"r-behind": lambda: time.time() - skew, "r-ahead": time.time}
        members = {r: Membership(sessions, r, expiry=10.0, clock=clock) for r, clock in clocks.items()}
        leases = {r: Lease(sessions, r, ttl=10.0, clock=clock) for r, clock in clocks.items()}
        try:
            for _ in range(3):  # three heartbeats each, in turns
                for replica in clocks:
                    members[replica].beat()
                    leases[replica].renew()
            assert members["r-behind"].live == members["r-ahead"].live == ("r-ahead", "r-behind")
            targets = [f"t{i:03d}" for i in range(200)]
            ownership = {r: Ownership(r, handover=15.0) for r in clocks}
            for r in clocks:  # joining: each waits a hand-over for targets a live replica may hold
                ownership[r].update(targets, members[r].live, clocks[r]())
            owned = {r: ownership[r].update(targets, members[r].live, clocks[r]() + 16.0)[0] for r in clocks}
            assert owned["r-behind"].isdisjoint(owned["r-ahead"])
            assert owned["r-behind"] | owned["r-ahead"] == set(targets)
            assert 60 < len(owned["r-behind"]) < 140  # rendezvous hashing spreads them
            leaders = [r for r in clocks if leases[r].held]
            assert len(leaders) == 1, leaders
            current = leases[leaders[0]].current()
            assert current is not None and current.holder == leaders[0] and current.token == 1
            # the lease runs out on the database's clock, whatever the holder's clock says
            assert abs(current.expires_at - time.time()) < 11.0
        finally:
            engine.dispose()


def test_a_second_process_on_one_sqlite_file_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'data' / 'llm-latency.db'}"
    held = lock_sqlite_file(url, "first")
    assert held is not None
    try:
        with pytest.raises(SecondReplicaRefused, match=r"replica first \(pid \d+ on host .*\) already runs on the "
                                                        r"SQLite database .*llm-latency.db.*PostgreSQL"):
            lock_sqlite_file(url, "second")
    finally:
        held.close()
    again = lock_sqlite_file(url, "third")  # released with its holder
    assert again is not None
    again.close()
    assert lock_sqlite_file("sqlite://", "x") is None and lock_sqlite_file("postgresql+psycopg://h/db", "x") is None


def _serve(data_dir: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_LATENCY_")}
    env.update({"LLM_LATENCY_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT)})
    return subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(free_port())], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _close(proc: subprocess.Popen[str]) -> None:
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def test_the_service_refuses_a_second_replica_on_sqlite_and_starts_after_a_kill(tmp_path: Path) -> None:
    first = _serve(tmp_path)
    try:
        assert first.stdout is not None
        banner = first.stdout.readline()
        assert "LLM Latency Monitor on http://" in banner, first.stderr.read() if first.stderr else ""
        second = _serve(tmp_path)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 1
        assert "Error: refusing to start: replica " in err
        assert f"(pid {first.pid} on host " in err and "SQLite serves one replica" in err
        assert "LLM_LATENCY_DATABASE_URL=postgresql+psycopg://" in err
        _close(second)
    finally:
        os.kill(first.pid, signal.SIGKILL)  # the kernel drops its lock with it
        first.wait(30)
        _close(first)
    third = _serve(tmp_path)
    try:
        assert third.stdout is not None
        assert "LLM Latency Monitor on http://" in third.stdout.readline()
    finally:
        third.terminate()
        third.wait(30)
        _close(third)


def test_default_replica_ids_are_unique_per_start() -> None:
    ids = {replicas.default_replica_id() for _ in range(50)}
    assert len(ids) == 50 and all(f"-{os.getpid()}-" in i for i in ids)


def test_a_lease_released_at_a_clean_stop_is_taken_without_a_warning(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A clean stop sets the lease's expiry to the epoch (RELEASED): the next replica says it took a released
    lease, not that it "expired 56 years ago"; one that expired under a replica that did not stop warns with
    its age."""
    engine = db.make_engine(migrated_sqlite(tmp_path / "lease.db"))
    sessions = db.make_sessionmaker(engine)
    clock = {"now": 1_800_000_000.0}
    a, b = (Lease(sessions, name, ttl=3.0, clock=lambda: clock["now"], shared_clock=lambda _: clock["now"])
            for name in ("r-a", "r-b"))
    try:
        assert a.renew() and a.token == 1
        a.release()
        current = a.current()
        assert current is not None and current.expires_at == replicas.RELEASED == 0.0
        with caplog.at_level("INFO", logger=replicas.__name__):
            assert b.renew() and b.token == 2
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
            ("INFO", "taking the leader lease r-a released at its stop"),
            ("INFO", "this replica (r-b) leads, fencing token 2")]
        caplog.clear()
        clock["now"] += 7.5  # b stopped renewing (killed): its lease expired 4.5 s ago
        with caplog.at_level("INFO", logger=replicas.__name__):
            assert a.renew() and a.token == 3
        assert ("WARNING", "taking over the leader lease from r-b (expired 4.5s ago)") in [
            (r.levelname, r.getMessage()) for r in caplog.records]
    finally:
        engine.dispose()
