"""Client timing against an emulated engine, judged in the emulator's simulated seconds.

The emulator's histograms record simulated time, and for a lone request on an idle
``synthetic=False`` target that time is exactly the roofline's: tokenization, the prefill
steps (in chunks of the token budget), then one decode step per token. So the engine's own
numbers are checked against the physics with float precision (:func:`lone_token_times`).

A client sees each token some wall time after the engine emitted it: HTTP on loopback, the
emulator's and the client's event loops, and the GIL they share in one test process. That
lag is never negative (a token leaves only once the simulated clock has passed the end of
the step that made it, and the client's clock starts before the request is sent), and it is
small but not tight: 2-5 ms idle, 10-75 ms measured with load average 8 on 2 cores. The
first token's lag also holds the time to reach the engine (connecting, sending, parsing),
which took over a second with load average 14 for a fresh connection. So a client number is
compared one-sided with the engine's: never below it, the first token at most
:data:`FIRST_TOKEN_LAG_S` wall seconds later, and every later token's lag within
:data:`CLIENT_LAG_S` of the first one's (x ``time_scale`` in simulated seconds). The tests
choose output lengths whose simulated spans are longer than that allowance, so a client ITL
off by a factor of two (or a time scale not applied) cannot hide in it.
"""

from __future__ import annotations

import itertools

from app.emulator.physics import Deployment
from app.emulator.simulation import TOKENIZE_BASE_S, TOKENIZE_PER_TOKEN_S
from app.probe.runner import RequestResult

#: How much later than the engine's emission a client may see a token (wall seconds).
CLIENT_LAG_S = 0.5
#: How much later the first token may arrive: the request also had to reach the engine.
FIRST_TOKEN_LAG_S = 2.0


def lone_ttft(deployment: Deployment, prompt_tokens: int, chunk: int) -> float:
    """Simulated TTFT of a request alone on an idle engine: tokenization + its prefill steps."""
    return TOKENIZE_BASE_S + TOKENIZE_PER_TOKEN_S * prompt_tokens + deployment.prefill_s(prompt_tokens, chunk)


def lone_token_times(deployment: Deployment, prompt_tokens: int, max_tokens: int, chunk: int) -> list[float]:
    """Simulated time of each token of a lone request after its arrival: the first at
    :func:`lone_ttft`, every next one a decode step later (at the context it has reached)."""
    times = [lone_ttft(deployment, prompt_tokens, chunk)]
    for k in range(1, max_tokens):
        times.append(times[-1] + deployment.step_seconds(1, prompt_tokens + k, prompt_tokens + k))
    return times


def client_token_times(request: RequestResult, time_scale: float) -> list[float]:
    """When the client received each token after sending the request, in simulated seconds."""
    return [t * time_scale for t in itertools.accumulate(request.itl, initial=request.ttft)]


def check_lag(client: float, engine: float, time_scale: float, what: str, lag_s: float = FIRST_TOKEN_LAG_S) -> None:
    """``client`` (simulated seconds, counted from sending the request) is never before
    ``engine`` (counted from the engine's arrival) and at most ``lag_s`` wall seconds after it."""
    allowance = lag_s * time_scale
    assert engine - 1e-9 <= client <= engine + allowance, \
        f"{what}: client {client:.6f} s vs engine {engine:.6f} s (allowed lag 0 .. {allowance:.3f} s simulated)"


def check_token_times(request: RequestResult, engine_times: list[float], time_scale: float) -> None:
    """Every token of ``request`` reached the client after the engine emitted it, the first
    within :data:`FIRST_TOKEN_LAG_S`, every later one with a lag within :data:`CLIENT_LAG_S`
    of the first one's (so the client's gaps add up to the engine's within that allowance)."""
    client = client_token_times(request, time_scale)
    assert len(client) == len(engine_times), (len(client), len(engine_times))
    check_lag(client[0], engine_times[0], time_scale, f"request {request.index} first token")
    first_lag = client[0] - engine_times[0]
    for k, (c, e) in enumerate(zip(client, engine_times)):
        assert c >= e - 1e-9, f"request {request.index} token {k}: client {c:.6f} s before engine {e:.6f} s"
        assert abs((c - e) - first_lag) <= CLIENT_LAG_S * time_scale, \
            f"request {request.index} token {k}: lag {c - e:.6f} s vs the first token's {first_lag:.6f} s"


def check_span(client_first: float, client_last: float, engine_first: float, engine_last: float,
               time_scale: float, what: str) -> None:
    """First and last token reached the client after the engine emitted them, and the span
    between them is the engine's within :data:`CLIENT_LAG_S` (simulated seconds)."""
    check_lag(client_first, engine_first, time_scale, f"{what} first token")
    assert client_last >= engine_last - 1e-9, f"{what}: last token at {client_last:.6f} s before {engine_last:.6f} s"
    assert abs((client_last - client_first) - (engine_last - engine_first)) <= CLIENT_LAG_S * time_scale, \
        f"{what}: span {client_last - client_first:.6f} s vs the engine's {engine_last - engine_first:.6f} s"
