"""What a Prometheus source reports about itself (the type :mod:`app.windows.base` hands to
features as the status of a backend that reads another server)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SourceStatus:
    """How a backend that reads another server (a Prometheus source) did in its last round: what
    ``GET /api/v1/sources``, ``/readyz`` and the status page report. Errors are classified text,
    never the server's."""

    name: str
    kind: str
    url: str
    target_labels: list[str]
    last_success: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    queries_last_round: int = 0
    bytes_last_round: int = 0  # answer bytes (decompressed) the last round read
    buckets_last_round: dict[str, int] = field(default_factory=dict)  # histogram -> targets whose buckets it read
    last_round_seconds: float | None = None
    targets: int = 0
    services: int = 0
    down: int = 0
    gone: int = 0
    bad_series: dict[str, int] = field(default_factory=dict)  # series dropped since the start, by reason
    refused: dict[str, str] = field(default_factory=dict)  # query -> why its last answer was too large
    # how often its Prometheus scrapes the engines (None: unknown), from "config" or "server", and how
    # it was learned or why it is unknown (app.promsource.intervals)
    scrape_interval: float | None = None
    scrape_interval_origin: str = ""
    scrape_interval_note: str = ""
    diagnosis_window: float | None = None  # the window its targets were last diagnosed over
    window_note: str = ""  # why that window (diagnosis.window, or widened to whole scrape intervals)
    # live replicas that lack a value of one of service_labels (in no service), and per label how many
    unlabelled: int = 0
    unlabelled_by_label: dict[str, int] = field(default_factory=dict)
    # the raw samples kept of its means series and TTFT/ITL buckets (app.promsource.mirror): how many series, when last
    # read, and why none are kept when its rounds query instead
    held_series: int = 0
    held_refreshed_at: float | None = None
    held_note: str = ""
    # per histogram name, the live replicas that have it as a native histogram alone: not read
    native_histograms: dict[str, int] = field(default_factory=dict)

    last_round_ok: bool | None = None  # None until the first round

    @property
    def failing(self) -> bool:
        return self.last_round_ok is False

    def native_note(self) -> str:
        """What :attr:`native_histograms` means for the reader ("" when there are none)."""
        if not self.native_histograms:
            return ""
        held = "; ".join(f"{name} on {count} replica{'' if count == 1 else 's'}"
                         for name, count in self.native_histograms.items())
        return (f"histograms held as native histograms alone are not read ({held}): keep their classic series "
                f"(always_scrape_classic_histograms: true)")
