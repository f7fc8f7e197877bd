"""What the status page and ``GET /api/v1/sources`` say about the diagnosis windows and services.

Per Prometheus source: the window its targets are judged over (``diagnosis.window``, at least
``window_intervals`` of its scrape intervals, :mod:`app.promsource.intervals`), the rules that
window still holds too few scrapes for (:mod:`app.diagnosis.sampling`), and the pods in no
service for lack of a service label, and the histograms it cannot read (held as native histograms
alone). For the targets this service scrapes itself: the rules
``diagnosis.window`` at their scrape interval leaves unjudged, per interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.diagnosis.sampling import window_warning
from app.store.models import DISCOVERED_BY_SOURCES, TargetView
from app.windows.base import SourceStatus


@dataclass(frozen=True, slots=True)
class WindowNote:
    """One line of the page: ``level`` warning (a rule is never judged) or note; ``subject``
    what it is about (``source prod``, ``3 targets``)."""

    level: str
    subject: str
    text: str


def source_window_warning(monitor: Any, status: SourceStatus) -> str | None:
    """The rules a source's diagnosis window holds too few scrapes for; None when it holds enough
    or the scrape interval is unknown."""
    if status.scrape_interval is None:
        return None
    window = status.diagnosis_window or monitor.diagnosis_config.window
    return window_warning(window, status.scrape_interval, monitor.diagnosis_config.thresholds)


def unlabelled_text(status: SourceStatus) -> str:
    """How many of a source's pods are in no service, and which labels they lack."""
    which = ", ".join(f"{name}: {count}" for name, count in status.unlabelled_by_label.items())
    pods = f"{status.unlabelled} pod{'' if status.unlabelled == 1 else 's'}"
    return f"{pods} lack a value of service_labels ({which}): diagnosed as replicas only, in no service"


def window_notes(monitor: Any, targets: Sequence[TargetView]) -> list[WindowNote]:
    """Every note of the page, warnings first."""
    notes: list[WindowNote] = []
    config = monitor.diagnosis_config
    for status in sorted(monitor.windows.statuses(), key=lambda s: s.name):
        subject = f"source {status.name}"
        warning = source_window_warning(monitor, status)
        if warning is not None:
            notes.append(WindowNote("warning", subject, f"its targets are {warning}"))
        elif status.diagnosis_window is not None and status.diagnosis_window > config.window:
            notes.append(WindowNote("note", subject, status.window_note))
        if status.unlabelled:
            notes.append(WindowNote("note", subject, unlabelled_text(status)))
        if status.native_histograms:
            notes.append(WindowNote("warning", subject, status.native_note()))
    by_interval: dict[float, list[str]] = {}
    for target in targets:
        if target.source not in DISCOVERED_BY_SOURCES:
            interval = target.scrape_interval or monitor.settings.default_scrape_interval
            by_interval.setdefault(interval, []).append(target.name)
    for interval, names in sorted(by_interval.items()):
        warning = window_warning(config.window, interval, config.thresholds)
        if warning is not None:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            notes.append(WindowNote("warning", f"{len(names)} target{'' if len(names) == 1 else 's'} ({shown})",
                                    warning))
    return sorted(notes, key=lambda n: n.level != "warning")
