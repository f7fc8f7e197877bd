"""Put recorded engine pages into a real Prometheus TSDB with their own timestamps.

The diagnosis harness scrapes an emulator on its simulated clock; the same pages, with the
same timestamps, go both into the built-in store and - through ``promtool tsdb
create-blocks-from openmetrics`` - into a Prometheus data directory. A Prometheus started
on that directory then answers PromQL over exactly the samples the built-in store holds,
so the two modes can be compared number for number, in seconds instead of hours.

HELP/TYPE lines are dropped (PromQL in 2.42 does not read metric types), every sample gets
the target's labels and its timestamp, and an ``up`` sample of 1 is written per scrape, as a
scraping Prometheus would.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

import httpx

from tests.support.components import require_binary

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?$")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def page_lines(page: str, labels: Mapping[str, str], ts: float) -> Iterable[str]:
    """One page's samples as OpenMetrics lines carrying ``labels`` and timestamp ``ts``."""
    extra = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    stamp = f"{ts:.3f}"
    yield f"up{{{extra}}} 1 {stamp}"
    for line in page.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise ValueError(f"unexpected exposition line: {line[:80]!r}")
        name, body, value = m.groups()
        inner = body[1:-1].rstrip(",") if body else ""
        joined = ",".join(part for part in (inner, extra) if part)
        yield f"{name}{{{joined}}} {value} {stamp}"


class Backfill:
    """Collects scrapes (labels, timestamp, page text), then writes a Prometheus data directory
    (:meth:`write_tsdb`) or imports them into a running VictoriaMetrics (:meth:`import_victoria_metrics`)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, labels: Mapping[str, str], ts: float, page: str) -> None:
        self.lines.extend(page_lines(page, labels, ts))

    def write_tsdb(self, workdir: Path, data_path: Path) -> None:
        """``promtool tsdb create-blocks-from openmetrics`` into ``data_path`` (created)."""
        promtool = require_binary("/usr/bin/promtool", "backfilling recorded pages into a Prometheus TSDB")
        source = workdir / "backfill.om"
        # OpenMetrics wants each series' samples in time order; grouping by series keeps that.
        by_series: dict[str, list[str]] = {}
        for line in self.lines:
            series = line.rsplit(" ", 2)[0]
            by_series.setdefault(series, []).append(line)
        source.write_text("\n".join(line for group in by_series.values() for line in group) + "\n# EOF\n")
        data_path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data_path)],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"promtool failed ({done.returncode}): {done.stderr[-2000:]}")

    def import_victoria_metrics(self, url: str, shift: float = 0.0, chunk: int = 20_000) -> int:
        """Send every sample, ``shift`` seconds later, to VictoriaMetrics' ``/api/v1/import/prometheus``
        (text format, millisecond timestamps), then flush so queries see them; returns the count.

        VictoriaMetrics refuses samples outside its retention (and far in the future): a whole
        number of seconds of ``shift`` moves the recording to the present without changing any
        interval between samples.
        """
        shift_ms = int(round(shift * 1000))
        if shift_ms % 1000:
            raise ValueError("shift must be a whole number of seconds")
        out = []
        for line in self.lines:
            series, stamp = line.rsplit(" ", 1)
            out.append(f"{series} {int(round(float(stamp) * 1000)) + shift_ms}")
        with httpx.Client(timeout=120) as client:
            for i in range(0, len(out), chunk):
                answer = client.post(f"{url}/api/v1/import/prometheus", content="\n".join(out[i:i + chunk]) + "\n")
                if answer.status_code != 204:
                    raise RuntimeError(f"import failed: HTTP {answer.status_code}: {answer.text[:500]}")
            client.get(f"{url}/internal/force_flush").raise_for_status()
        return len(out)
