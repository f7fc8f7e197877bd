"""Active probing: measure TTFT and ITL from the client side with streamed requests.

The engine's histograms see what happens inside the engine; a user sees everything on the
way (network, TLS, API server, tokenization, the queue). A probe streams requests with
input length, output length and concurrency held fixed (:mod:`~app.probe.sweep`) and
records when the first token arrives and every gap after it.

Modules (each usable alone):

* :mod:`~app.probe.runner` - one probe run: OpenAI-compatible streaming requests, bounded
  by request count, time limit and concurrency; typed per-request results and summaries;
* :mod:`~app.probe.sse` - a lenient Server-Sent-Events parser (malformed lines are counted,
  never fatal);
* :mod:`~app.probe.sweep` - the levels of a concurrency or prompt-length sweep, the
  TTFT-vs-prompt slope fit and the ITL-vs-concurrency curve, single-request vs. loaded
  comparison (queue time accounted for);
* :mod:`~app.probe.server_metrics` - the engine's own ``/metrics`` read around each level
  (its queue time while a single request ran);
* :mod:`~app.probe.canary` - small periodic probes per target, stored; the single-request
  baseline query for the diagnosis;
* :mod:`~app.probe.consistency` - client TTFT vs. the server's TTFT histogram over the
  same period ("time lost outside the engine");
* :mod:`~app.probe.repository` - the SQL of the probe tables;
* :mod:`~app.probe.telemetry` - a ``prometheus_client`` collector with the latest results;
* :mod:`~app.probe.cli` - the ``probe`` click command.
"""

from app.probe.runner import (
    ERROR_CLASSES,
    LevelPlan,
    LevelResult,
    ProbeResult,
    ProbeSpec,
    RequestResult,
    Stats,
    run_probe,
    run_probe_sync,
)

__all__ = [
    "ERROR_CLASSES",
    "LevelPlan",
    "LevelResult",
    "ProbeResult",
    "ProbeSpec",
    "RequestResult",
    "Stats",
    "run_probe",
    "run_probe_sync",
]
