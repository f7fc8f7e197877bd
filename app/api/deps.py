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


CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def holds_token(monitor: MonitorDep, credentials: CredentialsDep) -> bool:
    """Whether the request may do what the API token allows: it carries the token, or no
    token is configured (then the service only listens on loopback unless the operator set
    ``allow_unauthenticated_public``; see Settings.check_listen_security)."""
    token = monitor.settings.api_token
    if token is None:
        return True
    return credentials is not None and hmac.compare_digest(credentials.credentials.encode(),
                                                           token.get_secret_value().encode())


def require_token(allowed: Annotated[bool, Depends(holds_token)]) -> None:
    """Every write endpoint depends on this."""
    if not allowed:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or wrong API token",
                            headers={"WWW-Authenticate": "Bearer"})


WriteAuth = Depends(require_token)
#: For read endpoints: True when the caller may see text the service fetched from targets,
#: receivers and probed servers (see app.api.redaction). Reads never answer 401.
TokenHolderDep = Annotated[bool, Depends(holds_token)]
