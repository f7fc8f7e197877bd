"""The one check for every URL the service fetches or posts to: targets, probes, canaries
and alert receivers, whether they come from the config file or the API.

The API lets users add all of these, so without this check the service could be told to
fetch or post to arbitrary internal URLs (server-side request forgery); the config file
goes through the same check so a URL the API would refuse cannot come in by the file.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from urllib.parse import urlsplit

from pydantic import ValidationInfo

#: Validation-context key under which the config-file loader passes the host allow-list
#: (``LLM_LATENCY_ALLOWED_TARGET_HOSTS``) to the models' URL validators.
ALLOWED_HOSTS_CONTEXT = "allowed_target_hosts"


def validate_target_url(url: str, allowed_hosts: list[str]) -> str:
    """Accept only http(s) URLs with a host, restricted to ``allowed_hosts`` when it is not empty."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"URL scheme must be http or https, got {parts.scheme or 'none'!r}")
    if not parts.hostname:
        raise ValueError("URL has no host")
    try:
        _ = parts.port  # urlsplit parses the port lazily: this raises on a bad one
    except ValueError as exc:
        raise ValueError(f"bad port in URL: {exc}") from None
    if allowed_hosts and not host_allowed(parts.hostname, allowed_hosts):
        raise ValueError(f"host {parts.hostname!r} is not in allowed_target_hosts")
    return url


def host_allowed(host: str, allowed: list[str]) -> bool:
    """Exact names, ``*.suffix`` wildcards, IP addresses and CIDR networks."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in allowed:
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
        elif fnmatch.fnmatchcase(host.lower(), entry.lower()):
            return True
    return False


def check_url_in_file(url: str | None, info: ValidationInfo) -> str | None:
    """A model's URL validator: applies :func:`validate_target_url` while the config file is
    validated (its loader passes the allow-list in the context), so a bad URL is listed with
    the file's other problems, under its field path. Without that context (API bodies, stored
    rows) it does nothing: the API routes run the same function and answer 422 naming the field."""
    if url is None or not info.context or ALLOWED_HOSTS_CONTEXT not in info.context:
        return url
    return validate_target_url(url, info.context[ALLOWED_HOSTS_CONTEXT])
