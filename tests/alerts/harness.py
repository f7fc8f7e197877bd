"""Drive the alerting of a real service in simulated time.

Targets are real /metrics pages on 127.0.0.1 (down = HTTP 503, up = a vLLM page), receivers
are real webhook servers, the service is the real app on SQLite or PostgreSQL. Alert
rounds and delivery runs are called with an explicit ``now = t0 + t``, so a test can say
"resolve at t=15, evaluate at t=29 and t=30" without waiting; only scrapes run at wall
time (target-down conditions depend on the latest scrape, not on ``now``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from app.alerts.schemas import rfc3339
from tests.api.conftest import Service, make_service
from tests.support.engine_pages import VllmPage
from tests.support.pages import StaticPageServer
from tests.support.receiver import WebhookReceiver


@dataclass
class Harness:
    svc: Service
    pages: dict[str, StaticPageServer]
    hooks: dict[str, WebhookReceiver]
    t0: float = field(default_factory=time.time)
    seen: dict[str, int] = field(default_factory=dict)

    def down(self, *names: str) -> None:
        for name in names:
            self.pages[name].status = 503
            self.svc.scrape(name)

    def up(self, *names: str) -> None:
        for name in names:
            self.pages[name].status, self.pages[name].page = 200, VllmPage().render()
            self.svc.scrape(name)

    def evaluate(self, t: float) -> int:
        """One alert round at t0 + t; returns how many notifications it enqueued."""
        return self.svc.monitor.evaluate_alerts(now=self.t0 + t)["notifications"]

    def deliver(self, t: float) -> int:
        """Delivery runs at t0 + t until one delivers nothing (a group sends its head per run)."""
        total = 0
        while delivered := self.svc.client.portal.call(self.svc.monitor.delivery.run_once, self.t0 + t):
            total += delivered
        return total

    def at(self, t: float) -> dict[str, list[tuple[str, list[tuple[str, str]]]]]:
        """Evaluate and deliver at t0 + t; what each receiver got since the last call, as
        (payload status, [(target, alert status), ...])."""
        self.evaluate(t)
        self.deliver(t)
        return {name: [summary(m.json) for m in self.new_messages(name)] for name in self.hooks}

    def new_messages(self, name: str) -> list:
        received = self.hooks[name].received
        start, self.seen[name] = self.seen.get(name, 0), len(received)
        return received[start:]

    def notifications(self, receiver: str | None = None) -> list[dict]:
        """The delivery log, oldest first."""
        params = {"receiver": receiver} if receiver else {}
        return sorted(self.svc.client.get("/api/v1/notifications", params=params).json(),
                      key=lambda n: (n["createdAt"], n["seq"]))

    def alerts(self) -> dict[str, dict]:
        return {a["labels"]["target"]: a for a in self.svc.client.get("/api/v1/alerts").json()}

    def ts(self, t: float) -> str:
        return rfc3339(self.t0 + t)


def summary(message: dict) -> tuple[str, list[tuple[str, str]]]:
    if isinstance(message, list):  # an Alertmanager /api/v2/alerts body
        return "alertmanager", sorted((a["labels"]["target"], a.get("endsAt", "")) for a in message)
    return message["status"], sorted((a["labels"]["target"], a["status"]) for a in message["alerts"])


@contextlib.contextmanager
def alerting(database_url: str, tmp_path: Path, targets: dict[str, dict[str, str]],
             receivers: dict[str, dict], service: dict[str, object] | None = None,
             **alerts: object) -> Iterator[Harness]:
    """A service watching ``targets`` (name -> labels) with ``receivers`` (name -> extra
    receiver fields) and ``alerts`` settings (no SLOs, targets down fire at once, unless
    given); ``service``: settings of the service itself (its schedules are hours apart
    unless given, so only the test runs rounds)."""
    with contextlib.ExitStack() as stack:
        pages = {name: stack.enter_context(StaticPageServer(b"")) for name in targets}
        hooks = {name: stack.enter_context(WebhookReceiver()) for name in receivers}
        config = {
            "targets": [{"name": name, "url": pages[name].url, "labels": labels} for name, labels in targets.items()],
            "alerts": {"slos": [], "target_down_for": "0s", "external_url": "http://llm-latency.test", **alerts,
                       "receivers": [{"name": name, "url": hooks[name].url, **extra}
                                     for name, extra in receivers.items()]},
        }
        path = tmp_path / "targets.yaml"
        path.write_text(yaml.safe_dump(config))
        for svc in make_service(database_url, tmp_path, config_file=path,
                                **{"alert_interval": "1h", "delivery_interval": "1h", **(service or {})}):
            yield Harness(svc, pages, hooks)
