"""Models by Hub name (`org/name`, `org/name@revision`), as `vllm serve` takes them, without
their weights.

huggingface_hub does the Hub's part: its cache (HF_HOME, HF_HUB_CACHE) is looked in first and
filled as it would be for vLLM, HF_HUB_OFFLINE=1 keeps everything to that cache, HF_TOKEN
authenticates, HF_ENDPOINT points at a mirror. Only small files are downloaded: config.json and
the safetensors index. The checkpoint's tensors are sized from each safetensors file's header,
read with two ranged requests (its 8-byte length, then exactly that many bytes of JSON), so no
weight byte is fetched; when the files are already in the cache their headers are read there.

The Hub's errors become one EstimateError that says which model, why (HTTP 401/403/404, not
cached while offline) and what to do.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub
from huggingface_hub import constants, errors

from planner.errors import EstimateError
from planner.estimate.weights import TensorInfo, header_length, parse_header, read_header

# What vLLM and the Hub accept as a repo id, with an optional @revision (branch, tag or commit).
HUB_NAME = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?")
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Shards whose headers are read at the same time (a 405B checkpoint has about 190).
HEADER_READERS = 8
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class HubModel:
    repo_id: str
    # The commit every file was read at (what a branch or tag resolved to).
    revision: str
    # What was asked for: the branch, tag or commit after '@', else "main".
    requested: str
    # The cache snapshot folder of that commit; config.json is there.
    snapshot: Path

    @property
    def name(self) -> str:
        return f"{self.repo_id}@{self.requested}"


def is_hub_name(name: str) -> bool:
    return HUB_NAME.fullmatch(name) is not None


def vllm_model_flags(model: str) -> list[str]:
    """`--model` as vLLM takes it: `org/name@rev` becomes `--model org/name --revision rev`."""
    match = HUB_NAME.fullmatch(model)
    if match is None or match["revision"] is None or Path(model).exists():
        return ["--model", model]
    return ["--model", match["repo"], "--revision", match["revision"]]


def offline() -> bool:
    return constants.is_offline_mode()


def _explain(exc: Exception, name: str, what: str) -> EstimateError:
    """One line for a Hub failure: which model, why, and what to do."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    code = f"HTTP {status}" if status else "error"
    if isinstance(exc, errors.GatedRepoError):
        return EstimateError(
            f"{name} is a gated model ({code}): accept its licence on the model's Hub page, then set HF_TOKEN "
            "to a token of that account"
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        hint = "check the name" if status == 404 else "check the name; if the model is private or gated, set HF_TOKEN to a token that can read it"
        return EstimateError(f"{name}: no such model on the Hub, or no access to it ({code}): {hint}")
    if isinstance(exc, errors.RevisionNotFoundError):
        return EstimateError(f"{name}: the Hub has no such revision ({code}); give a branch, tag or commit after '@'")
    if isinstance(exc, errors.LocalEntryNotFoundError):
        why = "HF_HUB_OFFLINE=1 is set" if offline() else "the Hub cannot be reached"
        return EstimateError(
            f"{name}: {what} is not in the Hub cache ({constants.HF_HUB_CACHE}) and {why}; "
            f"fetch it once with `hf download {name.split('@')[0]} {what}` or unset HF_HUB_OFFLINE"
        )
    if isinstance(exc, errors.EntryNotFoundError):
        return EstimateError(f"{name}: the model has no {what} ({code}); vLLM needs one too")
    return EstimateError(f"{name}: reading {what} from the Hub failed ({code}): {exc}".splitlines()[0])


def _download(model: str, repo_id: str, filename: str, revision: str | None) -> Path:
    try:
        return Path(huggingface_hub.hf_hub_download(repo_id, filename, revision=revision))
    except (errors.HfHubHTTPError, errors.LocalEntryNotFoundError, errors.EntryNotFoundError, OSError) as exc:
        raise _explain(exc, model, filename) from None


def resolve(name: str) -> HubModel:
    """Find the commit `name` stands for and its config.json (from the cache when it is there)."""
    match = HUB_NAME.fullmatch(name)
    if match is None:
        raise EstimateError(f"{name!r} is not a Hub name (org/name or org/name@revision)")
    repo_id, requested = match["repo"], match["revision"]
    config = _download(name, repo_id, "config.json", requested)
    # The cache keeps every file of a commit under snapshots/<commit>/.
    return HubModel(repo_id=repo_id, revision=config.parent.name, requested=requested or "main", snapshot=config.parent)


def _optional(model: HubModel, filename: str) -> Path | None:
    """A small file of the commit, or None when the model has none."""
    try:
        return Path(huggingface_hub.hf_hub_download(model.repo_id, filename, revision=model.revision))
    except errors.RemoteEntryNotFoundError:
        return None
    except errors.LocalEntryNotFoundError as exc:
        if offline():
            # Not cached, and nothing may be fetched: unknown, which the caller says.
            return None
        raise _explain(exc, model.name, filename) from None
    except (errors.HfHubHTTPError, OSError) as exc:
        raise _explain(exc, model.name, filename) from None


def checkpoint_names(model: HubModel) -> list[str] | None:
    """The safetensors files of the commit (the index's, else model.safetensors), or None when
    the model has no safetensors checkpoint."""
    index = _optional(model, INDEX_FILE)
    if index is not None:
        try:
            return sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise EstimateError(f"{model.name}: {INDEX_FILE} is not a safetensors index (needs weight_map): {exc}") from None
    if (model.snapshot / SINGLE_FILE).is_file():
        return [SINGLE_FILE]
    if offline():
        # Without the index in the cache there is no telling; the caller says the weights are estimated.
        return None
    try:
        huggingface_hub.get_hf_file_metadata(huggingface_hub.hf_hub_url(model.repo_id, SINGLE_FILE, revision=model.revision))
    except errors.RemoteEntryNotFoundError:
        return None
    except errors.HfHubHTTPError as exc:
        raise _explain(exc, model.name, SINGLE_FILE) from None
    return [SINGLE_FILE]


def _ranged(url: str, first: int, last: int, where: str) -> bytes:
    """Bytes first..last (inclusive) of a file on the Hub; never more, even from a server that ignores Range."""
    session = huggingface_hub.get_session()
    headers = {**huggingface_hub.utils.build_hf_headers(), "Range": f"bytes={first}-{last}", "Accept-Encoding": "identity"}
    want = last - first + 1
    with session.stream("GET", url, headers=headers, timeout=TIMEOUT_S) as response:
        if response.status_code >= 400:
            response.read()
            huggingface_hub.utils.hf_raise_for_status(response)
        if response.status_code != 206 and first > 0:
            raise EstimateError(f"{where}: the server ignored the byte range (HTTP {response.status_code}); not reading the weights")
        data = bytearray()
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) >= want:
                break
    return bytes(data[:want])


def remote_header(model: HubModel, filename: str) -> list[TensorInfo]:
    """One safetensors file's tensors, from its header alone: two ranged reads."""
    url = huggingface_hub.hf_hub_url(model.repo_id, filename, revision=model.revision)
    where = f"{model.repo_id}@{model.revision[:12]}/{filename}"
    try:
        length = header_length(_ranged(url, 0, 7, where), where)
        raw = _ranged(url, 8, 8 + length - 1, where)
    except errors.HfHubHTTPError as exc:
        raise _explain(exc, model.name, filename) from None
    if len(raw) < length:
        raise EstimateError(f"{where}: header says {length} bytes but only {len(raw)} came back")
    return parse_header(raw, where, filename)


@dataclass(frozen=True)
class HubTensors:
    tensors: list[TensorInfo]
    files: int
    # "Hub cache" (every file was there) or "Hub headers" (ranged reads).
    read_from: str


def checkpoint_tensors(model: HubModel) -> HubTensors | None:
    """Every tensor of the commit's safetensors checkpoint, or None when it has none (or, offline,
    when the cache does not say which files it has)."""
    names = checkpoint_names(model)
    if not names:
        return None
    local = [model.snapshot / n for n in names]
    if all(p.is_file() for p in local):
        return HubTensors([t for p in local for t in read_header(p)], len(names), "Hub cache")
    if offline():
        return None
    with ThreadPoolExecutor(max_workers=min(HEADER_READERS, len(names))) as pool:
        per_file = list(pool.map(lambda n: remote_header(model, n), names))
    return HubTensors([t for file in per_file for t in file], len(names), "Hub headers")
