"""Shared helpers for the emulator tests."""

from __future__ import annotations

from dataclasses import replace

from app.emulator.engine import EngineConfig
from app.emulator.physics import Deployment
from app.emulator.readout import Page, signature
from app.emulator.scenarios import Scenario
from app.emulator.simulation import Simulation
from app.emulator.workload import LengthDist, TrafficStream


def custom(name: str = "custom", *, deployment: Deployment | None = None, engine: EngineConfig | None = None,
           streams: tuple[TrafficStream, ...] = (), model_name: str = "test-model") -> Scenario:
    """A one-off scenario (8B on A100 unless told otherwise)."""
    return Scenario(name, deployment or Deployment.of("A100-80G", "llama-3.1-8b"), engine or EngineConfig(),
                    streams, None, "test", model_name)


def single_stream(prompt: LengthDist, output: int, *, think: float = 1.0, **dep) -> Scenario:
    """One closed-loop client: never more than one request in the engine."""
    stream = TrafficStream(name="one", clients=1, think_time_s=think, prompt=prompt,
                           output=LengthDist.fixed(output), max_tokens=output, ignore_eos=True)
    deployment = Deployment.of(dep.pop("gpu", "A100-80G"), dep.pop("model", "llama-3.1-8b"), **dep)
    return custom("single", deployment=deployment, engine=EngineConfig(enable_prefix_caching=False), streams=(stream,))


def window(sim: Simulation, warm: float, seconds: float, engine: str = "vllm") -> dict:
    """Run ``warm`` simulated seconds, then measure the signature over the next ``seconds``."""
    sim.run_for(warm)
    before = Page(sim.render_metrics())
    sim.run_for(seconds)
    return signature(sim.render_metrics(), before, seconds=seconds, engine=engine)


def with_engine(sc: Scenario, **changes) -> Scenario:
    return replace(sc, engine=replace(sc.engine, **changes))
