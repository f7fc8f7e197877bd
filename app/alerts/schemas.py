"""Alertmanager-compatible shapes: label-set fingerprints and the webhook payload (version "4").

Field for field what a real Alertmanager 0.25 sends (``tests/fixtures/alertmanager-
webhook-sample*.json`` were captured from one), so receivers written for Alertmanager
(chat bridges, incident tools) work unchanged:

    {"receiver", "status", "alerts": [{"status", "labels", "annotations", "startsAt",
     "endsAt", "generatorURL", "fingerprint"}], "groupLabels", "commonLabels",
     "commonAnnotations", "externalURL", "version": "4", "groupKey", "truncatedAlerts"}
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time, which Alertmanager sends for "not ended"
_FNV_OFFSET, _FNV_PRIME, _MASK = 14695981039346656037, 1099511628211, (1 << 64) - 1


def fingerprint(labels: Mapping[str, str]) -> str:
    """Prometheus' ``LabelSet.Fingerprint()``: FNV-1a 64 over sorted name, 0xff, value, 0xff.

    Identical to what Alertmanager puts in ``fingerprint``, so the same alert has the same
    id whether it reaches a receiver through this service or through Alertmanager.
    """
    h = _FNV_OFFSET
    for name in sorted(labels):
        for part in (name.encode(), b"\xff", labels[name].encode(), b"\xff"):
            for byte in part:
                h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return f"{h:016x}"


def rfc3339(ts: float | None) -> str:
    """Alertmanager's timestamp format (UTC, millisecond precision); None -> Go zero time."""
    if ts is None:
        return ZERO_TIME
    text = dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def unix(rfc3339_text: str) -> float:
    """The inverse of :func:`rfc3339` (for a time that is not Go's zero time)."""
    return dt.datetime.fromisoformat(rfc3339_text).timestamp()


def group_key(group_labels: Mapping[str, str]) -> str:
    """Alertmanager's groupKey for a route at the root: ``{}:{name="value", ...}``."""
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(group_labels.items()))
    return "{}:{" + inner + "}"


@dataclass(slots=True)
class AlertInstance:
    labels: dict[str, str]
    annotations: dict[str, str]
    status: str  # firing | resolved
    starts_at: float
    ends_at: float | None
    generator_url: str

    def to_webhook(self) -> dict[str, Any]:
        return {"status": self.status, "labels": dict(sorted(self.labels.items())),
                "annotations": dict(sorted(self.annotations.items())), "startsAt": rfc3339(self.starts_at),
                "endsAt": rfc3339(self.ends_at), "generatorURL": self.generator_url,
                "fingerprint": fingerprint(self.labels)}

    def to_alertmanager(self, valid_until: float | None = None) -> dict[str, Any]:
        """One element of Alertmanager's ``POST /api/v2/alerts`` body. A firing alert gets
        ``endsAt = valid_until`` when given, as Prometheus sends it: Alertmanager keeps it
        firing until then and resolves it if no re-post extends it (without ``endsAt`` it
        would resolve it after its ``resolve_timeout``)."""
        body = {"labels": self.labels, "annotations": self.annotations, "startsAt": rfc3339(self.starts_at),
                "generatorURL": self.generator_url}
        ends_at = self.ends_at if self.ends_at is not None else valid_until
        if ends_at is not None:
            body["endsAt"] = rfc3339(ends_at)
        return body


def alertmanager_post_at(body: str, queued_at: float, now: float) -> str:
    """An Alertmanager post (the ``kind: alertmanager`` body of :func:`notification_body`)
    queued at ``queued_at``, as it is to be sent at ``now``: each firing alert's ``endsAt``
    moves on by the time the post waited, so its validity counts from the delivery.

    Sent unchanged, a post that waited in the outbox longer than its validity (the
    Alertmanager was down) would arrive already ended: Alertmanager would resolve the
    alert, and the next re-post would fire it again. A firing alert is one valid past
    ``queued_at`` (``endsAt = queued_at + validity``); a resolved alert's ``endsAt`` is its
    resolution, at or before the round that queued the post, and stays as it is."""
    waited = now - queued_at
    alerts = json.loads(body)
    if waited <= 0 or not isinstance(alerts, list):  # not late, or queued as a webhook payload
        return body
    for alert in alerts:
        if "endsAt" in alert and unix(alert["endsAt"]) > queued_at:
            alert["endsAt"] = rfc3339(unix(alert["endsAt"]) + waited)
    return json.dumps(alerts, separators=(",", ":"))


def _common(dicts: list[dict[str, str]]) -> dict[str, str]:
    if not dicts:
        return {}
    common = dict(dicts[0])
    for d in dicts[1:]:
        common = {k: v for k, v in common.items() if d.get(k) == v}
    return dict(sorted(common.items()))


def webhook_payload(receiver: str, group_labels: Mapping[str, str], alerts: Iterable[AlertInstance],
                    external_url: str, max_alerts: int = 0) -> dict[str, Any]:
    alerts = list(alerts)
    status = "firing" if any(a.status == "firing" for a in alerts) else "resolved"
    truncated = 0
    if max_alerts and len(alerts) > max_alerts:
        truncated = len(alerts) - max_alerts
        alerts = alerts[:max_alerts]
    return {
        "receiver": receiver,
        "status": status,
        "alerts": [a.to_webhook() for a in alerts],
        "groupLabels": dict(sorted(group_labels.items())),
        "commonLabels": _common([a.labels for a in alerts]),
        "commonAnnotations": _common([a.annotations for a in alerts]),
        "externalURL": external_url,
        "version": "4",
        "groupKey": group_key(group_labels),
        "truncatedAlerts": truncated,
    }


def notification_body(kind: str, receiver: str, group_labels: Mapping[str, str], alerts: list[AlertInstance],
                      external_url: str, valid_until: float | None = None) -> tuple[str, str]:
    """(status, exact JSON body) of one notification: the webhook payload for ``kind:
    webhook``, the ``/api/v2/alerts`` list for ``kind: alertmanager`` (firing alerts valid
    until ``valid_until``)."""
    payload = webhook_payload(receiver, group_labels, alerts, external_url)
    content = [a.to_alertmanager(valid_until) for a in alerts] if kind == "alertmanager" else payload
    return payload["status"], json.dumps(content, separators=(",", ":"))
