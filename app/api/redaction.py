"""What readers of the API see of configured secrets and of text fetched from elsewhere.

Read endpoints need no token, so two kinds of text are kept from them:

* **Configured secrets.** A receiver's ``headers`` (``Authorization: Bearer ...``) are
  configuration the service sends, never something a reader needs echoed: their values are
  replaced by :data:`REDACTED` for everyone, token or not, the names kept (as a receiver's
  ``secret_env`` only ever names an environment variable, shown with ``has_secret``).
* **Text another server sent.** A receiver's response body (the delivery log keeps its
  first 1 KiB) and a probed server's answer quoted in a request's ``detail`` (an error
  body, an error event, malformed stream lines, protocol errors naming the bytes
  received) help an operator debug a failing receiver or engine, and may hold whatever
  that server put there (a stack trace, an echoed credential). They are stored, and shown
  only to requests that may write (:func:`app.api.deps.holds_token`); others see
  :data:`REDACTED` in their place, with the status code and error class intact.

Scrape errors need nothing here: they never contain page text in the first place
(:mod:`app.exposition.parser`, :mod:`app.scrape.client`).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from app.probe.runner import QUOTING_ERROR_CLASSES

REDACTED = "<redacted>"
HIDDEN_PASSWORD = "***"


def url_as_shown(url: str, token_holder: bool) -> str:
    """A configured URL as shown: a password in it (``http://user:pass@host/metrics``, which
    the scraper sends as basic auth) is replaced by ``***`` for readers without the token
    (and always on the status page); token holders get the URL as stored, so a read-edit-PUT
    round trip keeps it."""
    if token_holder:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{HIDDEN_PASSWORD}@{host}"))


def header_names(headers: dict[str, str]) -> dict[str, str]:
    """Receiver headers as shown: every value redacted."""
    return {name: REDACTED for name in headers}


def fetched_text(text: str | None, token_holder: bool) -> str | None:
    """Text another server sent: as stored for a token holder, else redacted (nothing stays nothing)."""
    return text if token_holder or not text else REDACTED


def probe_request_detail(error: str | None, detail: str | None, token_holder: bool) -> str | None:
    """A probe request's ``detail``: redacted for readers without the token when its error
    class may quote the server (``timeout``, ``stalled``, ``connect``... are the runner's words)."""
    return fetched_text(detail, token_holder) if error in QUOTING_ERROR_CLASSES else detail
