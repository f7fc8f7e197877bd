"""Dependencies shared by the routes: the monitor, a database session, the probe jobs, auth."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated

import anyio.from_thread
from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy.orm import Session

from app.lifespan import Monitor
from app.probe.jobs import ProbeJobs
from app.runtime.budget import RequestBudget
from app.settings import Settings

_bearer = HTTPBearer(auto_error=False)


def get_monitor(request: Request) -> Monitor:
    return request.app.state.monitor


MonitorDep = Annotated[Monitor, Depends(get_monitor)]


def get_session(monitor: MonitorDep) -> Iterator[Session]:
    """One session per request; the route commits (unit of work = request)."""
    with monitor.sessions() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def get_probe_jobs(monitor: MonitorDep) -> ProbeJobs:
    """The probes running in the background of this service (owned by the Monitor)."""
    return monitor.probe_jobs


ProbeJobsDep = Annotated[ProbeJobs, Depends(get_probe_jobs)]


def token_accepted(settings: Settings, authorization: str | None) -> bool:
    """The one check of the API token, for :func:`holds_token` and for the middleware
    that refuses unauthenticated writes before their body is read (app.api.guards).
    True when no token is configured: the service then only listens on loopback unless the
    operator set ``allow_unauthenticated_public`` (see Settings.check_listen_security)."""
    token = settings.api_token
    if token is None:
        return True
    scheme, credentials = get_authorization_scheme_param(authorization)
    return scheme.lower() == "bearer" and hmac.compare_digest(credentials.encode(), token.get_secret_value().encode())


UNAUTHORIZED = "missing or wrong API token"


def holds_token(request: Request, monitor: MonitorDep,
                _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> bool:
    """Whether the request may do what the API token allows: write, and read fetched text
    (``_bearer`` declares the scheme in the OpenAPI document; the header is checked by
    :func:`token_accepted`)."""
    return token_accepted(monitor.settings, request.headers.get("authorization"))


def require_token(allowed: Annotated[bool, Depends(holds_token)]) -> None:
    """Every write endpoint depends on this."""
    if not allowed:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})


WriteAuth = Depends(require_token)
#: For read endpoints: True when the caller may see text the service fetched from targets,
#: receivers and probed servers (see app.api.redaction). Reads never answer 401.
TokenHolderDep = Annotated[bool, Depends(holds_token)]


def request_budget(request: Request, monitor: MonitorDep) -> RequestBudget:
    """The time budget of an expensive read (``api_request_budget``) and a poll of its client's
    connection. Polled from the worker thread that computes the answer, which asks the event
    loop (``Request.is_disconnected``); outside a worker thread it says the client is there."""

    def disconnected() -> bool:
        try:
            return anyio.from_thread.run(request.is_disconnected)
        except RuntimeError:  # not in a worker thread of the event loop (a direct call)
            return False

    return RequestBudget(monitor.settings.api_request_budget, disconnected)


BudgetDep = Annotated[RequestBudget, Depends(request_budget)]
