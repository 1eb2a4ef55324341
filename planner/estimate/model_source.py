"""A model as the user names it -> its config.json and its checkpoint's tensors.

A path that exists is a local model folder (or a config.json); otherwise a name like
`org/name` or `org/name@revision` is a Hub model (planner.estimate.hub), as for `vllm serve`.
Resolution is remembered for the process, so a sweep reads the Hub once, not once per point.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import EstimateError
from planner.estimate import hub
from planner.estimate.architecture import Architecture, load_config, parse_architecture
from planner.estimate.weights import TensorInfo, checkpoint_files, read_header


@dataclass(frozen=True)
class Checkpoint:
    tensors: list[TensorInfo]
    files: int
    # Where the headers were read: "local files", "Hub cache" or "Hub headers" (ranged reads).
    read_from: str


# eq=False: compared and hashed by identity (resolve_model returns one object per name), so the
# checkpoint's headers are read once per model however many points ask.
@dataclass(frozen=True, eq=False)
class ModelSource:
    name: str
    config: dict[str, Any]
    config_path: str
    # The Hub commit everything was read at; None for a local folder.
    revision: str | None
    hub_model: hub.HubModel | None
    local_dir: Path | None

    def architecture(self) -> Architecture:
        return parse_architecture(self.config, self.config_path)

    def checkpoint(self) -> Checkpoint | None:
        """The checkpoint's tensors from its safetensors headers, or None when there are none to read."""
        return _checkpoint(self)

    def why_no_checkpoint(self) -> str:
        if self.hub_model is not None and hub.offline():
            return "HF_HUB_OFFLINE=1 and the safetensors index is not in the Hub cache"
        return "no safetensors found"


@functools.lru_cache(maxsize=16)
def _checkpoint(source: ModelSource) -> Checkpoint | None:
    if source.hub_model is not None:
        found = hub.checkpoint_tensors(source.hub_model)
        return None if found is None else Checkpoint(found.tensors, found.files, found.read_from)
    if source.local_dir is None:
        return None
    files = checkpoint_files(source.local_dir)
    if not files:
        return None
    return Checkpoint([t for f in files for t in read_header(f)], len(files), "local files")


@functools.lru_cache(maxsize=16)
def resolve_model(name: str) -> ModelSource:
    """Raises EstimateError when the name is neither a local path nor a Hub model that can be read."""
    path = Path(name)
    if not path.exists() and hub.is_hub_name(name):
        model = hub.resolve(name)
        config, config_path = load_config(model.snapshot / "config.json")
        return ModelSource(
            name=name,
            config=config,
            config_path=f"{model.repo_id}@{model.revision[:12]}/config.json",
            revision=model.revision,
            hub_model=model,
            local_dir=None,
        )
    config, config_path = load_config(path)
    return ModelSource(
        name=name, config=config, config_path=config_path, revision=None, hub_model=None, local_dir=path if path.is_dir() else None
    )

