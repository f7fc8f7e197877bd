"""Engine emulator: physically grounded vLLM/TGI simulators serving real-format ``/metrics``
and OpenAI-compatible streaming completions, for the demo, the diagnosis tests and
benchmarks.

Layers (each usable alone):

* :mod:`~app.core.hardware` / :mod:`~app.emulator.physics` - GPU and model presets, the
  roofline step-time model and the inspectable floors;
* :mod:`~app.emulator.engine` - a vLLM-like continuous-batching scheduler with a paged KV
  cache, chunked prefill, prefix caching and recompute preemption;
* :mod:`~app.emulator.workload` - seeded open/closed-loop traffic;
* :mod:`~app.emulator.simulation` - engine + traffic + metrics on a simulated clock
  (``Simulation(...).run_for(seconds)`` offline);
* :mod:`~app.emulator.exposition` - the vLLM (current and pre-0.11) and TGI pages;
* :mod:`~app.emulator.scenarios` - named regimes and transitions;
* :mod:`~app.emulator.server` - HTTP targets (``EmulatorFleet``, ``start_targets``);
* :mod:`~app.emulator.readout` - parse pages back, quantiles, regime signatures;
* :mod:`~app.emulator.cli` - the ``emulate`` click command.
"""

from app.emulator.scenarios import Scenario, ScenarioPlan
from app.emulator.scenarios import get as get_scenario
from app.emulator.scenarios import names as scenario_names
from app.emulator.server import EmulatedTarget, EmulatorFleet, TargetSpec, start_targets
from app.emulator.simulation import RunStats, Simulation

__all__ = [
    "EmulatedTarget",
    "EmulatorFleet",
    "RunStats",
    "Scenario",
    "ScenarioPlan",
    "Simulation",
    "TargetSpec",
    "get_scenario",
    "scenario_names",
    "start_targets",
]
