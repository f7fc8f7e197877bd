"""Alert sources, the alert lifecycle, and notification planning.

Every evaluation:
1. collects the conditions that are true now — active diagnosis findings (one alert per
   target x model x regime), SLO breaches per target, error-budget burn rates of the
   ``slos:`` section per SLO x target x window pair, targets whose scrapes fail;
2. advances each alert (keyed by the fingerprint of its labels): pending while its
   condition holds for less than ``for``, then firing; resolved when it clears;
3. plans notifications per group (``group_by`` labels) and receiver: a receiver is
   notified when an alert of the group starts firing or resolves (at most every
   ``group_interval`` per receiver and group; a change inside it goes out when the group
   is due again), and again every ``repeat_interval`` while something still fires. An
   Alertmanager sink is re-posted every ``resend_interval`` instead, and a re-post
   carries the group's changes too: while something fires, a change reaches it after at
   most min(``group_interval``, ``resend_interval``), so more often than every
   ``group_interval`` when ``resend_interval`` is shorter (a group with nothing firing
   left waits for ``group_interval``). Silenced alerts are left out. The
   notification rows, and the log of what each receiver was told, are written in the same
   transaction as the state changes, so a crash can never lose one without also losing
   the change it reports.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote

from sqlalchemy.orm import Session

from app import latency
from app.alerts import repository as alert_repository
from app.alerts import silences as silence_rules
from app.alerts.config import SLO_BURN, TARGET_DOWN, AlertsConfig, ReceiverConfig, regime_alertname, runbook_url
from app.alerts.schemas import AlertInstance, fingerprint, group_key, notification_body
from app.core import human, quantiles
from app.core.durations import format_duration, format_utc
from app.diagnosis import repository as diagnosis_repository
from app.diagnosis.findings import Evidence
from app.runtime.scheduling import ALERTS_JOB, target_boundary
from app.slo.status import SloStatus
from app.sources import exports_histogram
from app.store import repository
from app.store.models import AlertRow, NotificationLogRow, known_engine
from app.targets import repository as target_repository
from app.windows import Windows, default_windows
from app.windows.base import HistogramsRead, WindowReader

QUANTILE_KEYS = {0.5: "p50", 0.9: "p90", 0.95: "p95", 0.99: "p99"}
#: The annotation that says what changed before an alert fired (docs/changes.md), set once, at firing.
WHAT_CHANGED = "what_changed"
#: What changed on a target up to ``now`` since its alert's condition began (``since``), in one
#: sentence (None: nothing to say), read in the round's session: app.attribution's, handed in by
#: the composition root. Arguments: session, target, now, since.
WhatChanged = Callable[[Session, str, float, float], str | None]
#: How many targets' attributions a round computes for the alerts it fires. One attribution reads
#: eight windows of its target (app/attribution/reads.py), inside the round's transaction: a
#: storm of hundreds of alerts firing at once would hold the round (and the database) for
#: minutes. The most severe first; the others say where their attribution is.
EXPLAINED_PER_ROUND = 3
_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


@dataclass(slots=True)
class Condition:
    labels: dict[str, str]
    annotations: dict[str, str]
    for_: float
    value: float | None = None
    fp: str = field(init=False)

    def __post_init__(self) -> None:
        self.fp = fingerprint(self.labels)


def _links(config: AlertsConfig, target: str, alertname: str) -> dict[str, str]:
    links = {"runbook_url": runbook_url(config.external_url, alertname)}
    if config.dashboard_url:
        sep = "&" if "?" in config.dashboard_url else "?"
        links["dashboard_url"] = f"{config.dashboard_url}{sep}var-target={quote(target)}"
    return links


def diagnosis_conditions(session: Session, config: AlertsConfig) -> list[Condition]:
    out = []
    target_labels = {t.name: dict(t.labels) for t in target_repository.list_targets(session)}
    for target, row in diagnosis_repository.finding_history(session, states=("active",)):
        labels_extra = target_labels.get(target, {})
        details = row.details
        evidence = "; ".join(Evidence.from_dict(e).text() for e in details.get("evidence", []) if e.get("op") != "info")
        caused = f" (a symptom of {details['caused_by']})" if details.get("caused_by") else ""
        labels = {**labels_extra, "alertname": regime_alertname(row.regime), "target": target, "model": row.model,
                  "regime": row.regime, "severity": row.severity}
        annotations = {
            "summary": f"{target}: {row.regime.replace('_', ' ')}{caused} - {row.summary}",
            "description": f"{row.summary} Evidence: {evidence}. Active since "
                           f"{format_utc(row.activated_at or row.first_seen)}.",
            "remedies": "\n".join(f"- {r}" for r in details.get("remedies", [])),
            "confidence": f"{row.confidence:.2f}",
            **_links(config, target, labels["alertname"]),
        }
        out.append(Condition(labels, annotations, config.diagnosis_for))
    return out


def slo_signals(signal: str, engine: str | None = None) -> tuple[str, ...]:
    """What an SLO on ``signal`` reads: the signal, and for TTFT queue + prefill (TGI's derived
    TTFT) unless ``engine`` is known to export a TTFT histogram."""
    if signal == "ttft" and exports_histogram(engine, "ttft") is not True:
        return (signal, "queue_time", "prefill_time")
    return (signal,)


def slo_histograms(session: Session, config: AlertsConfig, now: float, windows: WindowReader
                   ) -> tuple[dict[float, HistogramsRead], frozenset[str]]:
    """SLO window length -> every target an SLO of that length covers -> its histograms over
    ``[now - length, now]``: the SLOs that share a length (both defaults do) read each target
    once, in one set of reads per backend; and the names of the targets whose backend could not
    answer (their SLO alerts are held: missing data neither fires nor resolves an alert)."""
    if not config.slos:
        return {}, frozenset()
    targets = [t for t in target_repository.list_targets(session) if t.gone_at is None and not Windows.is_aggregate(t)]
    out: dict[float, HistogramsRead] = {}
    held: set[str] = set()
    for length in sorted({slo.window for slo in config.slos}):
        same = [slo for slo in config.slos if slo.window == length]
        chosen = [t for t in targets if any(slo.covers(t.name) for slo in same)]
        signals = sorted({slo.signal for slo in same})
        # a target whose quantile is at or below the threshold fires nothing: a source may skip its buckets
        above = {signal: [(slo.quantile, slo.threshold) for slo in same if slo.signal == signal] for signal in signals}
        read = out[length] = windows.histograms(session, chosen, now - length, now, signals, above)
        # queue and prefill only for a TTFT objective's targets whose engine may lack a TTFT histogram
        derived = [t for t in chosen if any(slo.covers(t.name) and len(slo_signals(slo.signal, known_engine(t))) > 1
                                            for slo in same)]
        if derived:
            more = windows.histograms(session, derived, now - length, now, ["queue_time", "prefill_time"])
            for target_id, found in more.found.items():
                read.found[target_id] = {**(read.found.get(target_id) or {}), **found}
            read.failed |= more.failed
        held.update(t.name for t in chosen if t.id in read.failed)
    return out, frozenset(held)


def slo_conditions(session: Session, config: AlertsConfig, by_length: dict[float, HistogramsRead],
                   failed: set[str] | None = None) -> list[Condition]:
    """``by_length``: :func:`slo_histograms`. The names of targets that could not be evaluated
    are added to ``failed``."""
    out = []
    targets = [t for t in target_repository.list_targets(session) if t.gone_at is None]
    for slo in config.slos:
        chosen = [t for t in targets if slo.covers(t.name)]
        for target in chosen:
            with target_boundary(ALERTS_JOB, target.name) as outcome:  # one target's failure stops no other's
                read = by_length.get(slo.window)
                histograms = read.found.get(target.id) if read is not None else None
                if histograms is None:
                    continue  # no numbers this round (an aggregate; or its backend failed: held)
                summaries = latency.summarize_histograms({s: histograms.get(s)
                                                          for s in slo_signals(slo.signal, known_engine(target))})
                summary = summaries.get(slo.signal)
                if summary is None:
                    continue
                key = QUANTILE_KEYS.get(slo.quantile)
                merged = histograms.get(slo.signal)
                bucket: tuple[float, float] | None = None
                if summary.derived:
                    # no quantile of a derived TTFT, only a bound: the objective is breached for sure
                    # when the bound's lower end is above it
                    bound = summary.bounds.get(key) if key is not None else None
                    value, bucket = (bound[0], bound) if bound is not None else (None, None)
                elif key is not None:
                    value, bucket = getattr(summary, key), summary.interval(key)
                else:
                    assert merged is not None
                    value, bucket = quantiles.bucket_quantile(slo.quantile, merged.bounds, merged.increases)
                if value is None or value != value or value <= slo.threshold:
                    continue
                label = f"p{slo.quantile * 100:g} {slo.signal.upper().replace('_', ' ')}"
                if summary.derived:
                    shown = f"at least {human.seconds(value)}"
                    how = (f" (derived from queue and prefill: the true {label} lies in "
                           f"{human.bounded(bucket)}; quantiles do not add)")
                else:
                    shown = human.quantile(value, bucket)  # the bucket itself when the value sits on its edge
                    how = f" (interpolated inside the bucket {human.interval(bucket)})" if bucket and "–" not in shown \
                        else ""
                labels = {**dict(target.labels), "alertname": slo.alertname, "target": target.name, "slo": slo.name,
                          "severity": slo.severity}
                count = human.count(summary.count or 0, summary.count_estimate)
                annotations = {
                    "summary": f"{target.name}: {label} is {shown}, above the {slo.threshold:g}s objective",
                    "description": f"{label} over the last {slo.window:g}s is {shown}{how} "
                                   f"(objective: at most {slo.threshold:g}s, {count} observations).",
                    **_links(config, target.name, slo.alertname),
                }
                out.append(Condition(labels, annotations, slo.for_, value))
            if outcome.failed and failed is not None:
                failed.add(target.name)
    return out


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.3g}%"


def slo_burn_conditions(config: AlertsConfig, statuses: list[SloStatus]) -> list[Condition]:
    """One condition per SLO, target and burn alert (window pair) whose burn rate exceeds
    its factor over both windows (the SRE workbook's multiwindow, multi-burn-rate alert).
    No ``for``: the short window is what keeps it from firing on a blip, and what lets it
    resolve soon after the burn stops."""
    out = []
    for status in statuses:
        for part in status.targets:
            for alert in part.alerts:
                if not alert.firing:
                    continue
                long_w, short_w = format_duration(alert.long.window), format_duration(alert.short.window)
                labels = {**part.labels, "alertname": SLO_BURN, "target": part.target, "slo": status.name,
                          "severity": alert.severity, "burn": alert.kind, "long_window": long_w,
                          "short_window": short_w}
                budget = None if part.period is None else part.period.burn_rate(status.objective)
                left = None if budget is None else 1.0 - budget
                annotations = {
                    "summary": f"{part.target}: SLO {status.name} burns its error budget {alert.long_burn:.1f}x "
                               f"over {long_w} and {alert.short_burn:.1f}x over {short_w} (threshold "
                               f"{alert.factor:g}x, {alert.kind})",
                    "description": f"{status.objective * 100:g}% of requests should have {status.signal} at or "
                                   f"under {status.threshold:g}s over {format_duration(status.period_seconds)}. "
                                   f"Good requests: {_percent(alert.long.sli)} over {long_w}, "
                                   f"{_percent(alert.short.sli)} over {short_w}. Budget left over the period: "
                                   f"{_percent(left)} on this target, {_percent(status.budget_remaining)} for the "
                                   f"SLO (coverage {status.coverage * 100:.0f}%).",
                    "long_burn_rate": f"{alert.long_burn:.4g}",
                    "short_burn_rate": f"{alert.short_burn:.4g}",
                    "budget_left": "" if left is None else f"{left:.4g}",
                    **_links(config, part.target, SLO_BURN),
                }
                out.append(Condition(labels, annotations, 0.0, alert.long_burn))
    return out


def target_down_conditions(session: Session, config: AlertsConfig) -> list[Condition]:
    out = []
    latest = repository.latest_scrapes(session)
    for target in target_repository.target_rows(session):
        scrape = latest.get(target.id)
        if scrape is None or scrape.up or target.gone_at is not None:  # a gone replica is not down
            continue
        labels = {**dict(target.labels), "alertname": TARGET_DOWN, "target": target.name, "severity": "critical"}
        annotations = {"summary": f"{target.name}: scrapes fail ({scrape.error_class})",
                       "description": f"The last scrape of {target.url} failed: {scrape.error_class}: "
                                      f"{scrape.error}. No latency data is collected while it is down.",
                       **_links(config, target.name, TARGET_DOWN)}
        out.append(Condition(labels, annotations, config.target_down_for))
    return out


def evaluate(session: Session, config: AlertsConfig, receivers: list[ReceiverConfig], now: float,
             generator_url: str = "", eval_interval: float = 15.0,
             slo_reads: dict[float, HistogramsRead] | None = None,
             held_targets: frozenset[str] = frozenset(), slo_statuses: list[SloStatus] | None = None,
             what_changed: WhatChanged | None = None) -> dict[str, int]:
    """One alerting round inside the caller's transaction. Returns counts for telemetry.

    ``eval_interval`` is how often rounds run; with ``resend_interval`` it bounds how long
    an Alertmanager may keep an alert firing without hearing from us again.
    ``slo_reads`` are the SLO conditions' histograms (:func:`slo_histograms`; default: read from
    the built-in store here); ``held_targets`` are the targets whose backend could not answer
    for them: their SLO alerts stay as they are (missing data neither fires nor resolves an
    alert). ``slo_statuses``: the ``slos:``
    section now (app/slo/status.py), for the burn-rate alerts; a target it could not evaluate
    (an error) keeps its burn-rate alerts as they are, for the same reason. ``what_changed``:
    when an alert of a target starts firing, its one-sentence attribution becomes the alert's
    ``what_changed`` annotation, kept while it fires (computed once)."""
    failed: set[str] = set()  # targets whose SLO conditions could not be evaluated: held too
    if slo_reads is None:
        slo_reads = slo_histograms(session, config, now, default_windows())[0]
    conditions = {c.fp: c for c in (diagnosis_conditions(session, config)
                                    + slo_conditions(session, config, slo_reads, failed)
                                    + slo_burn_conditions(config, slo_statuses or [])
                                    + target_down_conditions(session, config))}
    unevaluated = {(s.name, p.target) for s in slo_statuses or [] for p in s.targets if p.error is not None}
    held = held_targets | failed
    rows = {row.fingerprint: row for row in alert_repository.open_alerts(session)
            if not (row.labels.get("slo") and row.labels.get("target") in held)
            and not (row.alertname == SLO_BURN and (row.labels.get("slo"), row.labels.get("target")) in unevaluated)}
    fired: list[tuple[AlertRow, Condition]] = []  # the alerts that start firing in this round
    known = alert_repository.get_alerts(session, sorted(fp for fp in conditions if fp not in rows))
    for fp, cond in conditions.items():
        gk = group_key({k: cond.labels.get(k, "") for k in config.group_by})
        row = rows.get(fp) or known.get(fp)
        if row is None or row.state == "resolved":
            row = alert_repository.start_alert(session, row, fp, cond.labels, cond.annotations, gk, now, cond.value)
        else:
            kept = {WHAT_CHANGED: row.annotations[WHAT_CHANGED]} if WHAT_CHANGED in (row.annotations or {}) else {}
            row.annotations, row.value, row.last_evaluated = {**cond.annotations, **kept}, cond.value, now
        if row.state == "pending" and now - row.active_since >= cond.for_:
            row.state, row.starts_at, row.ends_at = "firing", now, None
            fired.append((row, cond))
    if what_changed is not None:
        explain_fired(session, fired, now, what_changed)
    for fp, row in rows.items():
        if fp in conditions:
            continue
        if row.state == "firing":
            row.state, row.ends_at, row.last_evaluated = "resolved", now, now
        elif row.ends_at is not None:  # pending again after an episode that fired: still that resolved alert
            row.state, row.last_evaluated = "resolved", now
        else:
            alert_repository.delete_alert(session, row)  # pending that cleared: never was an alert
    session.flush()
    valid_for = 4 * max(eval_interval, config.resend_interval)
    created = plan_notifications(session, config, receivers, now, generator_url, valid_for)
    return {"conditions": len(conditions), "notifications": created}


def explain_fired(session: Session, fired: Sequence[tuple[AlertRow, Condition]], now: float,
                  what_changed: WhatChanged) -> None:
    """Set the ``what_changed`` annotation of the alerts that start firing now: one attribution
    per target (its alerts share it), for at most :data:`EXPLAINED_PER_ROUND` targets, the most
    severe alerts' first; the alerts of the others say that it was not computed and where it is."""
    targets: dict[str, float] = {}  # target -> since (its earliest condition), most severe first
    for row, cond in sorted(fired, key=lambda f: (_SEVERITY_ORDER.get(f[1].labels.get("severity", ""), 3),
                                                  f[1].labels.get("target", ""))):
        target = cond.labels.get("target", "")
        if target:
            targets[target] = min(targets.get(target, row.active_since), row.active_since)
    explained = list(targets)[:EXPLAINED_PER_ROUND]
    said = {target: what_changed(session, target, now, targets[target]) for target in explained}
    for row, cond in fired:
        target = cond.labels.get("target", "")
        if target in said:
            sentence = said[target]
        elif target:
            sentence = (f"not computed: alerts of {len(targets)} targets started firing in the same round and "
                        f"{EXPLAINED_PER_ROUND} are explained at firing; GET /api/v1/targets/{target}/changes "
                        "explains this one")
        else:
            sentence = None
        if sentence:
            row.annotations = {**cond.annotations, WHAT_CHANGED: sentence}


def plan_notifications(session: Session, config: AlertsConfig, receivers: list[ReceiverConfig], now: float,
                       generator_url: str, valid_for: float) -> int:
    """Enqueue the notifications due now, per receiver and group, and log what each told.

    For each (receiver, group) the log holds the alerts that receiver was last told are
    firing. News is a routed, unsilenced alert firing that it was not told about, or one
    it was told about that no longer fires. News goes out at once for a group never
    notified, else once ``group_interval`` has passed since that receiver's last
    notification of the group; with no news, still-firing alerts are repeated every
    ``repeat_interval`` (webhooks) or re-posted every ``resend_interval`` with ``endsAt =
    now + valid_for`` (Alertmanager sinks, which resolve an alert they stop hearing
    about; the delivery counts ``valid_for`` from when the post is sent). The log changes
    only with an enqueued notification, so news that is not due yet is still news at the
    next round.
    """
    names = [r.name for r in receivers]
    alert_repository.delete_notification_logs(session, names, idle_before=now - config.group_interval)
    logs = alert_repository.notification_logs(session)
    told = {fp for log in logs.values() for fp in log.firing}
    by_group: dict[str, list[AlertRow]] = {gk: [] for _, gk in logs}
    for row in alert_repository.notifiable_alerts(session, told):
        by_group.setdefault(row.group_key, []).append(row)
    active_silences = alert_repository.active_silences(session, now)
    muted = {row.fingerprint for rows in by_group.values() for row in rows
             if silence_rules.silenced_by(active_silences, row.labels, now)}
    created = 0
    for gk, rows in by_group.items():
        group_labels = {k: rows[0].labels.get(k, "") for k in config.group_by} if rows else {}
        for receiver in receivers:
            log = logs.get((receiver.name, gk))
            was_firing = set(log.firing) if log else set()
            mine = [r for r in rows if _routed(receiver, r.labels)]
            # what the log may keep: firing alerts, and (for send_resolved) told ones whose
            # resolution is still to be sent, e.g. because a silence mutes it for now
            keep = {r.fingerprint for r in mine if r.state == "firing" or receiver.send_resolved} & was_firing
            firing = [r for r in mine if r.state == "firing" and r.fingerprint not in muted]
            resolved = [r for r in mine if r.state != "firing" and r.fingerprint in keep and r.fingerprint not in muted]
            news = bool(resolved) or any(r.fingerprint not in was_firing for r in firing)
            if _due(session, config, receiver, gk, log, now, bool(firing), news):
                instances = [AlertInstance(r.labels, r.annotations, "firing", r.starts_at or r.active_since, None,
                                           generator_url) for r in firing]
                instances += [AlertInstance(r.labels, r.annotations, "resolved", r.starts_at or r.active_since,
                                            r.ends_at, generator_url) for r in resolved]
                status, body = notification_body(receiver.kind, receiver.name, group_labels, instances,
                                                 config.external_url, valid_until=now + valid_for)
                alert_repository.enqueue_notification(session, str(uuid.uuid4()), receiver.name, gk, status, body, now)
                created += 1
                keep = (keep - {r.fingerprint for r in resolved}) | {r.fingerprint for r in firing}
                alert_repository.save_notification_log(session, log, receiver.name, gk, sorted(keep), now)
            elif log is not None and keep != was_firing:  # forget what will never be sent (no longer routed ...)
                log.firing = sorted(keep)
    return created


def _due(session: Session, config: AlertsConfig, receiver: ReceiverConfig, gk: str, log: NotificationLogRow | None,
         now: float, firing: bool, news: bool) -> bool:
    if not firing and not news:
        return False
    if log is None:
        return True
    if news and now - log.sent_at >= config.group_interval:
        return True
    if receiver.kind == "alertmanager":
        # a re-post only refreshes endsAt, and one still waiting in the outbox (the
        # Alertmanager is down) gets its endsAt counted from its delivery: queueing more
        # would only pile up copies
        return (firing and now - log.sent_at >= config.resend_interval
                and not alert_repository.has_pending_notification(session, receiver.name, gk))
    return firing and now - log.sent_at >= config.repeat_interval


def _routed(receiver: ReceiverConfig, labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in receiver.match.items())
