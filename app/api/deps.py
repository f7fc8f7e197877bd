"""Dependencies shared by the routes: the monitor, a database session, auth."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app.lifespan import Monitor

_bearer = HTTPBearer(auto_error=False)


def get_monitor(request: Request) -> Monitor:
    return request.app.state.monitor


MonitorDep = Annotated[Monitor, Depends(get_monitor)]


def get_session(monitor: MonitorDep) -> Iterator[Session]:
    """One session per request; the route commits (unit of work = request)."""
    with monitor.sessions() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def require_token(monitor: MonitorDep,
                  credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """Every write endpoint depends on this. Without a configured token the service
    only listens on loopback (see Settings.check_listen_security)."""
    token = monitor.settings.api_token
    if token is None:
        return
    if credentials is None or not hmac.compare_digest(credentials.credentials.encode(),
                                                      token.get_secret_value().encode()):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or wrong API token",
                            headers={"WWW-Authenticate": "Bearer"})


WriteAuth = Depends(require_token)
