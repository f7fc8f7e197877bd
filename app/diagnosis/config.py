"""The ``diagnosis:`` section of the targets YAML: how often, over which window, with which
thresholds the regimes are judged."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.core.durations import Seconds
from app.core.limits import MAX_LIST_LENGTH, MAX_TEXT_LENGTH
from app.core.thresholds import Thresholds
from app.core.validation import format_validation_error

#: The thresholds a target may override (``diagnosis.overrides``): the expected latency ranges of
#: ``unexplained``. The other thresholds are also those of the exported Prometheus rules and the
#: dashboards, which are written per engine, not per target.
PER_TARGET_THRESHOLDS = tuple(name for name in Thresholds.model_fields if name.startswith("expected_"))


class ThresholdOverride(BaseModel):
    """Expected latency ranges for the targets whose names match, over ``diagnosis.thresholds``:
    a batch deployment whose TTFT is minutes by design, a CPU engine."""

    model_config = ConfigDict(extra="forbid")

    targets: list[Annotated[str, Field(min_length=1, max_length=MAX_TEXT_LENGTH)]] = Field(
        min_length=1, max_length=MAX_LIST_LENGTH, description="Target names; shell-style wildcards (batch-*, gpu-?).")
    thresholds: dict[str, float] = Field(min_length=1, description=f"Any of {', '.join(PER_TARGET_THRESHOLDS)}.")

    @field_validator("thresholds")
    @classmethod
    def _known(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(PER_TARGET_THRESHOLDS))
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not a per-target threshold (these are: "
                             f"{', '.join(PER_TARGET_THRESHOLDS)})")
        try:
            checked = Thresholds.model_validate(value)
        except ValidationError as exc:
            raise ValueError(format_validation_error(exc)) from None
        return {name: getattr(checked, name) for name in value}

    def matches(self, target: str) -> bool:
        return any(fnmatchcase(target, pattern) for pattern in self.targets)


class DiagnosisConfig(BaseModel):
    """How often regimes are evaluated, over which window, with which thresholds."""

    model_config = ConfigDict(extra="forbid")

    interval: Seconds = Field(30.0, gt=0, description="Evaluation interval.")
    window: Seconds = Field(60.0, gt=0, description="Window each evaluation looks at. Keep it at most ~2.5 "
                            "intervals: a regime is detected once it fills most of the window.")
    thresholds: Thresholds = Field(default_factory=Thresholds)
    overrides: list[ThresholdOverride] = Field(default_factory=list, max_length=MAX_LIST_LENGTH,
                                               description="Expected latency ranges per target; where several "
                                                           "match a target, the later ones win.")

    def thresholds_for(self, target: str) -> Thresholds:
        """``thresholds`` with every override that matches ``target`` applied, in order."""
        changes = {k: v for o in self.overrides if o.matches(target) for k, v in o.thresholds.items()}
        return self.thresholds.model_copy(update=changes) if changes else self.thresholds
