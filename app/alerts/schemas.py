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
    text = dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


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

    def to_webhook(self) -> dict:
        return {"status": self.status, "labels": dict(sorted(self.labels.items())),
                "annotations": dict(sorted(self.annotations.items())), "startsAt": rfc3339(self.starts_at),
                "endsAt": rfc3339(self.ends_at), "generatorURL": self.generator_url,
                "fingerprint": fingerprint(self.labels)}

    def to_alertmanager(self, valid_until: float | None = None) -> dict:
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


def _common(dicts: list[dict[str, str]]) -> dict[str, str]:
    if not dicts:
        return {}
    common = dict(dicts[0])
    for d in dicts[1:]:
        common = {k: v for k, v in common.items() if d.get(k) == v}
    return dict(sorted(common.items()))


def webhook_payload(receiver: str, group_labels: Mapping[str, str], alerts: Iterable[AlertInstance],
                    external_url: str, max_alerts: int = 0) -> dict:
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
