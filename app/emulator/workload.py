"""Synthetic traffic: who sends what, and when.

A workload is a tuple of :class:`TrafficStream` s. Each stream is either *open loop*
(Poisson arrivals at ``rate`` req/s, optionally with periodic bursts) or *closed loop*
(``clients`` users that each send a request, wait for the answer, think, and send the
next one - concurrency-limited traffic as produced by a benchmark client or a batch job).

Every random draw comes from a ``random.Random`` owned by the stream and seeded from the
simulation seed and the stream's position, never from the global generator, so a run is
reproducible and HTTP traffic joining the same simulation does not perturb it.

Lengths are in tokens. The *output* distribution is the position of the end-of-sequence
token the "model" would produce; a request ends there (finish reason ``stop``) unless
``max_tokens`` comes first (``length``) or ``ignore_eos`` is set.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: ``fixed``, ``uniform`` (inclusive) or ``lognormal``
    (given by its median and log-space sigma, clamped to [low, high])."""

    kind: str = "fixed"
    value: int = 1
    low: int = 1
    high: int = 1_000_000
    median: float = 1.0
    sigma: float = 0.0

    @classmethod
    def fixed(cls, n: int) -> LengthDist:
        return cls("fixed", value=int(n), low=int(n), high=int(n))

    @classmethod
    def uniform(cls, low: int, high: int) -> LengthDist:
        return cls("uniform", low=int(low), high=int(high))

    @classmethod
    def lognormal(cls, median: float, sigma: float, low: int = 1, high: int = 1_000_000) -> LengthDist:
        return cls("lognormal", median=float(median), sigma=float(sigma), low=int(low), high=int(high))

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "lognormal"):
            raise ValueError(f"unknown length distribution {self.kind!r}")
        if self.low > self.high:
            raise ValueError("low > high")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.value
        if self.kind == "uniform":
            return rng.randint(self.low, self.high)
        x = rng.lognormvariate(math.log(self.median), self.sigma)
        return max(self.low, min(self.high, int(round(x))))

    @property
    def mean(self) -> float:
        """Approximate mean (ignores clamping for lognormal)."""
        if self.kind == "fixed":
            return float(self.value)
        if self.kind == "uniform":
            return (self.low + self.high) / 2
        return min(self.high, self.median * math.exp(self.sigma**2 / 2))


@dataclass(frozen=True)
class Burst:
    """Periodic bursts of an open-loop stream: for ``duration_s`` out of every
    ``period_s`` seconds (starting at ``offset_s``) the rate is multiplied by ``multiplier``."""

    period_s: float
    duration_s: float
    multiplier: float
    offset_s: float = 0.0

    def factor(self, t: float) -> float:
        return self.multiplier if ((t - self.offset_s) % self.period_s) < self.duration_s else 1.0


@dataclass(frozen=True)
class TrafficStream:
    """One class of traffic.

    Set ``rate`` (req/s, Poisson) for open-loop traffic or ``clients`` (with an
    exponentially distributed ``think_time_s`` between a response and the next request)
    for closed-loop traffic. A request starts with one of ``num_prefixes`` shared prefixes
    of ``prefix_tokens`` tokens (a system prompt, a few-shot header) with probability
    ``prefix_share``; the sampled prompt length is then the part after that prefix.
    """

    name: str = "default"
    rate: float = 0.0
    clients: int = 0
    think_time_s: float = 0.0
    prompt: LengthDist = LengthDist.fixed(256)
    output: LengthDist = LengthDist.fixed(128)
    max_tokens: int = 4096
    ignore_eos: bool = False
    prefix_tokens: int = 0
    prefix_share: float = 0.0
    num_prefixes: int = 1
    burst: Burst | None = None
    start_s: float = 0.0  # relative to the stream's scenario start
    #: LoRA: each request asks for one of this many adapters (``adapter-00``...), uniformly; 0: the base model
    adapters: int = 0

    def __post_init__(self) -> None:
        if (self.rate > 0) == (self.clients > 0):
            raise ValueError(f"stream {self.name!r}: set exactly one of rate (open loop) or clients (closed loop)")
        if not 0 <= self.prefix_share <= 1:
            raise ValueError("prefix_share must be in [0, 1]")

    @property
    def closed_loop(self) -> bool:
        return self.clients > 0


@dataclass
class Draw:
    """One request's sampled shape."""

    prompt_tokens: int
    max_tokens: int
    natural_output: int
    prefix_id: str | None
    prefix_tokens: int
    adapter: str | None = None


class StreamRuntime:
    """Lazily generates a stream's requests (the simulation pulls one arrival at a time)."""

    def __init__(self, stream: TrafficStream, seed: int, index: int, start: float, max_model_len: int) -> None:
        self.stream = stream
        self.rng = random.Random(f"{seed}/{index}/{stream.name}")
        self.start = start + stream.start_s
        self.active = True
        self.max_model_len = max_model_len
        self._t = self.start  # open loop: time of the last candidate arrival

    def draw(self) -> Draw:
        s, rng = self.stream, self.rng
        prefix_id, prefix_len = None, 0
        if s.prefix_tokens and s.prefix_share and rng.random() < s.prefix_share:
            prefix_id = f"{s.name}/prefix-{rng.randrange(s.num_prefixes)}"
            prefix_len = s.prefix_tokens
        prompt = prefix_len + s.prompt.sample(rng)
        prompt = max(1, min(prompt, self.max_model_len - 1))
        natural = max(1, s.output.sample(rng))
        max_tokens = max(1, min(s.max_tokens, self.max_model_len - prompt))
        adapter = f"adapter-{rng.randrange(s.adapters):02d}" if s.adapters else None  # no draw without LoRA
        return Draw(prompt, max_tokens, natural, prefix_id, min(prefix_len, prompt), adapter)

    def next_open_loop_arrival(self) -> float:
        """Next Poisson arrival time (thinning for bursts)."""
        s, rng = self.stream, self.rng
        peak = s.rate * (s.burst.multiplier if s.burst and s.burst.multiplier > 1 else 1.0)
        while True:
            self._t += rng.expovariate(peak)
            if s.burst is None:
                return self._t
            if rng.random() * peak <= s.rate * s.burst.factor(self._t):
                return self._t

    def initial_client_times(self) -> list[float]:
        """Closed loop: clients start spread over the first think time (or 1 s)."""
        spread = max(self.stream.think_time_s, 1.0)
        return [self.start + self.rng.random() * spread for _ in range(self.stream.clients)]

    def think(self) -> float:
        t = self.stream.think_time_s
        return self.rng.expovariate(1.0 / t) if t > 0 else 0.0
