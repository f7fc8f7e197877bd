"""Bodies of the probe API, and the bounds every API-started probe obeys.

The API lets anyone with write access make the service send requests to an inference
endpoint, so every dimension of a probe is capped here: requests per level and in total,
concurrency, prompt and output length, per-request timeout and the run's time limit, and
how many probes run at the same time.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, ValidationInfo, field_validator

from app.core.durations import parse_duration
from app.core.limits import MAX_HEADER_VALUE_LENGTH, MAX_URL_LENGTH

MAX_CONCURRENCY = 64
MAX_LEVELS = 8
MAX_REQUESTS_PER_LEVEL = 256
MAX_REQUESTS_TOTAL = 512
MAX_PROMPT_TOKENS = 32768
MAX_OUTPUT_TOKENS = 4096
MAX_REQUEST_TIMEOUT = 300.0
MAX_TIME_LIMIT = 600.0
DEFAULT_TIME_LIMIT = 120.0
MAX_RUNNING_PROBES = 4

Seconds = Annotated[float, BeforeValidator(parse_duration)]


def _int_list(value: object) -> object:
    """``8``, ``"1,8,32"`` or ``[1, 8, 32]``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, str):
        try:
            return [int(part) for part in value.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"expected integers separated by commas, got {value!r}") from None
    return value


class ProbeIn(BaseModel):
    ("""An ad hoc probe: ``requests`` streamed requests per level, one level per concurrency or per
    prompt length (only one of the two may vary), output length fixed. ``target`` names a monitored target """
     """(its URL's scheme/host/port is the API),
    ``url`` gives the API base URL directly (or overrides the target's).""")

    model_config = ConfigDict(extra="forbid")

    target: str | None = Field(None, max_length=64)
    url: str | None = Field(None, max_length=MAX_URL_LENGTH)
    model: str | None = Field(None, max_length=256)
    prompt_tokens: Annotated[list[Annotated[int, Field(ge=1, le=MAX_PROMPT_TOKENS)]],
                             BeforeValidator(_int_list)] = Field(
        default_factory=lambda: [512], min_length=1, max_length=MAX_LEVELS,
        description="One length, or several (a prompt-length sweep at one concurrency).")
    max_tokens: int = Field(128, ge=1, le=MAX_OUTPUT_TOKENS)
    concurrency: Annotated[list[Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]],
                           BeforeValidator(_int_list)] = Field(
        default_factory=lambda: [1], min_length=1, max_length=MAX_LEVELS,
        description="One level, or several (a concurrency sweep at one prompt length).")
    requests: int | None = Field(None, ge=1, le=MAX_REQUESTS_PER_LEVEL,
                                 description="Per level; default 2 x the level's concurrency.")
    chat: bool = False
    endpoint: str | None = Field(None, pattern=r"^/[A-Za-z0-9_./-]*$", max_length=256)
    timeout: Seconds = Field(60.0, gt=0, le=MAX_REQUEST_TIMEOUT, description="Per request.")
    stall_timeout: Seconds = Field(30.0, gt=0, le=MAX_REQUEST_TIMEOUT)
    time_limit: Seconds = Field(DEFAULT_TIME_LIMIT, gt=0, le=MAX_TIME_LIMIT, description="Whole run.")
    ignore_eos: bool = True
    api_key: SecretStr | None = Field(None, max_length=MAX_HEADER_VALUE_LENGTH,
                                      description="Sent as 'Authorization: Bearer'; never stored.")

    @field_validator("concurrency", "prompt_tokens")
    @classmethod
    def _distinct(cls, levels: list[int], info: ValidationInfo) -> list[int]:
        if len(set(levels)) != len(levels):
            raise ValueError(f"{info.field_name} levels must be distinct")
        return levels

    def params(self) -> dict:
        """What is stored with the run (never the API key)."""
        return self.model_dump(mode="json", exclude={"api_key"})
