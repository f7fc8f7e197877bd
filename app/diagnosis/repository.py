"""The diagnosis' SQL: diagnoses, findings and their lifecycle. Callers own the transaction
boundary."""

from __future__ import annotations

import hashlib
import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    Text,
    cast,
    select,
    tuple_,
)
from sqlalchemy.orm import Session, defer

from app.runtime.kept import KeptParts
from app.store.models import (
    DiagnosisRow,
    FindingRow,
    Target,
)

log = logging.getLogger(__name__)


def open_findings(session: Session, target_id: int, model: str) -> list[FindingRow]:
    return list(session.scalars(select(FindingRow).where(
        FindingRow.target_id == target_id, FindingRow.model == model, FindingRow.state.in_(("pending", "active")))))


def all_open_findings(session: Session) -> dict[tuple[int, str], list[FindingRow]]:
    """Every pending or active finding by (target id, model): one query for a whole round."""
    out: dict[tuple[int, str], list[FindingRow]] = defaultdict(list)
    for row in session.scalars(select(FindingRow).where(FindingRow.state.in_(("pending", "active")))):
        out[(row.target_id, row.model)].append(row)
    return out


def _finding_fields(payload: dict) -> dict:
    return {"severity": payload["severity"], "confidence": payload["confidence"], "is_primary": payload["primary"],
            "summary": payload["summary"],
            "details": {k: payload[k] for k in ("evidence", "remedies", "runbook", "caused_by", "window")}}


def create_finding(session: Session, target_id: int, model: str, regime: str, now: float, payload: dict,
                   flush: bool = True) -> FindingRow:
    """``flush`` False: a round writing many findings lets the commit insert them in one batch."""
    row = FindingRow(target_id=target_id, model=model, regime=regime, state="pending", first_seen=now,
                     last_seen=now, consecutive=1, clear_count=0, **_finding_fields(payload))
    session.add(row)
    if flush:
        session.flush()
    return row


def touch_finding(session: Session, row: FindingRow, now: float, payload: dict) -> None:
    """The regime fired again: refresh its evidence, extend the streak."""
    for key, value in _finding_fields(payload).items():
        setattr(row, key, value)
    row.last_seen = now
    row.consecutive += 1
    row.clear_count = 0


def clear_finding(session: Session, row: FindingRow, now: float) -> None:
    row.clear_count += 1
    row.consecutive = 0


def set_finding_state(session: Session, row: FindingRow, state: str, now: float, flush: bool = True) -> None:
    row.state = state
    if state == "active":
        row.activated_at = now
    elif state == "resolved":
        row.resolved_at = now
    if flush:
        session.flush()


def save_diagnosis(session: Session, target_id: int, model: str, verdict: str, now: float, details: dict,
                   rows: dict[tuple[int, str], DiagnosisRow] | None = None) -> None:
    """Insert or update a target/model's latest diagnosis. ``rows``: every stored diagnosis by
    (target id, model) when the caller saves a whole round (:func:`diagnosis_rows`, one query);
    without it the row is looked up and the change flushed at once."""
    row = session.get(DiagnosisRow, (target_id, model)) if rows is None else rows.get((target_id, model))
    digest = details_digest(details)
    if row is None:
        row = DiagnosisRow(target_id=target_id, model=model, verdict=verdict, evaluated_at=now, details=details,
                           digest=digest, digest_at=now)
        session.add(row)
        if rows is not None:
            rows[(target_id, model)] = row
    else:
        row.verdict, row.evaluated_at, row.details, row.digest, row.digest_at = verdict, now, details, digest, now
    if rows is None:
        session.flush()


def diagnosis_rows(session: Session) -> dict[tuple[int, str], DiagnosisRow]:
    """Every stored latest diagnosis by (target id, model), for a round's saves (their details,
    which the round replaces, are not loaded)."""
    return {(row.target_id, row.model): row
            for row in session.scalars(select(DiagnosisRow).options(defer(DiagnosisRow.details)))}


def details_digest(details: dict[str, Any]) -> str:
    """What a diagnosis' details are, in 32 hex digits (:func:`latest_diagnoses`)."""
    return hashlib.blake2b(json.dumps(details).encode(), digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class LatestDiagnosis:
    """A target's and model's stored latest evaluation; ``details`` is shared between readers
    (:func:`latest_diagnoses`) and must not be changed. ``version`` stands for the details:
    their digest, or the stored text where the row has no digest of this evaluation."""

    target: str
    model: str
    verdict: str
    evaluated_at: float
    details: dict[str, Any]
    version: str = field(default="", repr=False, compare=False)


#: a version of stored details -> their decoded value, for the rows of the last whole-fleet read
#: (what is made is the stored text, or the value already decoded)
DECODED_DETAILS = KeptParts[str, str | dict[str, Any], dict[str, Any]](
    lambda made: made if isinstance(made, dict) else json.loads(made))

_DIAGNOSIS_HEAD = (Target.name, DiagnosisRow.model, DiagnosisRow.verdict, DiagnosisRow.evaluated_at,
                   DiagnosisRow.target_id, DiagnosisRow.digest, DiagnosisRow.digest_at)
#: rows whose details one statement fetches
DETAILS_PER_FETCH = 500


def _digest_of(evaluated_at: float, digest: str | None, digest_at: float | None) -> str | None:
    """The row's digest if it was written with this evaluation (an older writer leaves it behind)."""
    return digest if digest is not None and digest_at == evaluated_at else None


def latest_diagnoses(session: Session, target_id: int | None = None) -> list[LatestDiagnosis]:
    """The latest evaluation of every target and model (of ``target_id`` only). The details
    change once per diagnosis round, but fetching and decoding every target's (4-5 KB each)
    for every status page and ``/api/v1/diagnoses`` read would be most of what those reads
    cost at 1,000 targets. So the rows are read without them first; only the details whose
    digest the last whole-fleet read did not decode are fetched (with the rest of their row
    again, so a row is never half of one evaluation and half of the next). A row whose digest
    is not of its evaluation (written by a version that predates digests) is fetched and keyed
    by its text. Only a whole-fleet read replaces what is kept, so the cache never outgrows
    the table."""
    head = select(*_DIAGNOSIS_HEAD).join(Target, Target.id == DiagnosisRow.target_id)
    if target_id is not None:
        head = head.where(DiagnosisRow.target_id == target_id)
    kept = DECODED_DETAILS.kept  # held: a read in another thread replaces it, never changes it
    rows: list[tuple] = []  # (name, model, verdict, evaluated_at, version, made)
    missing: dict[tuple[int, str], int] = {}  # (target id, model) -> index in rows
    for name, model, verdict, at, tid, digest, digest_at in session.execute(head.order_by(Target.name,
                                                                                          DiagnosisRow.model)):
        current = _digest_of(at, digest, digest_at)
        details = None if current is None else kept.get(current)
        if details is None:
            missing[(tid, model)] = len(rows)
        rows.append((name, model, verdict, at, digest, details))
    keys = list(missing)
    for i in range(0, len(keys), DETAILS_PER_FETCH):
        full = select(*_DIAGNOSIS_HEAD, cast(DiagnosisRow.details, Text)).join(
            Target, Target.id == DiagnosisRow.target_id).where(
            tuple_(DiagnosisRow.target_id, DiagnosisRow.model).in_(keys[i:i + DETAILS_PER_FETCH]))
        for name, model, verdict, at, tid, digest, digest_at, text_ in session.execute(full):
            rows[missing.pop((tid, model))] = (name, model, verdict, at, _digest_of(at, digest, digest_at) or text_,
                                               text_)
    gone = set(missing.values())  # deleted between the two reads (their target was removed)
    rows = [row for i, row in enumerate(rows) if i not in gone]
    decoded = DECODED_DETAILS.parts(((version, made) for *_, version, made in rows), keep=target_id is None)
    return [LatestDiagnosis(name, model, verdict, at, details, version)
            for (name, model, verdict, at, version, _), details in zip(rows, decoded, strict=True)]


def open_finding_states(session: Session, target_id: int | None = None
                        ) -> dict[tuple[str, str, str], tuple[str, float | None]]:
    """(target, model, regime) -> (state, activated_at) of every pending or active finding
    (of ``target_id`` only), without their details."""
    query = select(Target.name, FindingRow.model, FindingRow.regime, FindingRow.state, FindingRow.activated_at
                   ).join(Target, Target.id == FindingRow.target_id).where(FindingRow.state.in_(("pending", "active")))
    if target_id is not None:
        query = query.where(FindingRow.target_id == target_id)
    return {(name, model, regime): (state, activated_at)
            for name, model, regime, state, activated_at in session.execute(query)}


def finding_history(session: Session, target_id: int | None = None, since: float | None = None,
                    states: tuple[str, ...] = ("pending", "active", "resolved"), limit: int = 500
                    ) -> list[tuple[str, FindingRow]]:
    query = select(Target.name, FindingRow).join(Target, Target.id == FindingRow.target_id).where(
        FindingRow.state.in_(states))
    if target_id is not None:
        query = query.where(FindingRow.target_id == target_id)
    if since is not None:
        query = query.where(FindingRow.last_seen >= since)
    return [(name, row) for name, row in session.execute(query.order_by(FindingRow.first_seen.desc()).limit(limit))]
