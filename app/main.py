"""The FastAPI application. ``create_app`` does no I/O; the lifespan starts everything."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.gzip import GZipMiddleware

from app.api import docs, errors
from app.api.coalesce import CoalesceReads
from app.api.guards import LimitRequestBody, RequireTokenForWrites
from app.api.routes import alerts, capacity, changes, diagnoses, health, probes, runbooks, slos, status, targets
from app.lifespan import Monitor, lifespan
from app.settings import Settings

#: Answers to clients that accept gzip are compressed from this size on, at the fastest level:
#: at 1,000 targets ``/metrics`` is about 5 MB of text, and 5.8 MB of exposition compresses 8.2x
#: in 23 ms at level 1 (level 6: 10x in 56 ms), once per computation however many clients share
#: it. Sending bodies was 22 % of the interpreter's time under bench/load.py at 1,000 targets;
#: compressed, the same run answered 5 % more requests (32,384 against 30,741 in 10 minutes).
GZIP_MINIMUM_BYTES, GZIP_LEVEL = 4096, 1


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    app = FastAPI(
        title="LLM Latency Monitor",
        version="0.1.0",
        description="TTFT/ITL percentiles of LLM inference engines, computed exactly as Prometheus would, "
        "and why serving is slow.",
        lifespan=lifespan,
        docs_url=None,  # served from local assets by app.api.docs
        redoc_url=None,
    )
    app.state.monitor = Monitor(settings)
    app.include_router(health.router)
    app.include_router(targets.router)
    app.include_router(diagnoses.router)
    app.include_router(capacity.router)  # GET /api/v1/capacity
    app.include_router(changes.router)  # GET /api/v1/targets/{name}/changes, /events
    app.include_router(runbooks.router)  # GET/HEAD /runbooks, /runbooks/{name}
    app.include_router(alerts.router)
    app.include_router(slos.router)  # GET /api/v1/slos
    app.include_router(status.router)  # the HTML status page: GET /, /targets/{name}
    app.include_router(probes.router)
    docs.install(app)  # /docs without a CDN
    errors.install(app)
    # the last added runs first: the token is checked before the body is read
    app.add_middleware(LimitRequestBody, max_bytes=settings.max_request_bytes)
    app.add_middleware(RequireTokenForWrites, settings=settings)
    # inside the coalescing, so one computation is compressed once for all who share it
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MINIMUM_BYTES, compresslevel=GZIP_LEVEL)
    # identical concurrent reads share one computation; an unchanged answer is reused briefly
    app.add_middleware(CoalesceReads, max_age=settings.read_max_age)
    return app
