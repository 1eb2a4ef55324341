"""The base of every model a results file holds (replay.json, sweep.json and what they embed)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ResultModel(BaseModel):
    # Results files are read back (`planner report`, `compare`, a resumed sweep): fields a later
    # version added are ignored, not refused, so a newer file still loads.
    model_config = ConfigDict(extra="ignore")
