"""The targets YAML of a service that reads one Prometheus source (``prod``, the ``llm`` namespace,
one target per pod), its diagnosis window ``window`` seconds and its rounds run by the test."""

from __future__ import annotations

from pathlib import Path


def source_config(path: Path, prometheus_url: str, window: float) -> Path:
    path.write_text(f"""
targets: []
diagnosis: {{interval: 1h, window: {int(window)}s}}
sources:
  - name: prod
    url: {prometheus_url}
    selector: '{{namespace="llm"}}'
    target_labels: [namespace, pod]
    query_timeout: 10s
""")
    return path
