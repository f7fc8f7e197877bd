"""The ``diagnosis:`` section of the targets YAML: how often, over which window, with which
thresholds the regimes are judged."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.core.durations import Seconds
from app.core.thresholds import Thresholds


class DiagnosisConfig(BaseModel):
    """How often regimes are evaluated, over which window, with which thresholds."""

    model_config = ConfigDict(extra="forbid")

    interval: Seconds = Field(30.0, gt=0, description="Evaluation interval.")
    window: Seconds = Field(60.0, gt=0, description="Window each evaluation looks at. Keep it at most ~2.5 "
                            "intervals: a regime is detected once it fills most of the window.")
    thresholds: Thresholds = Field(default_factory=Thresholds)
