"""A local HTTP server that answers as the Hugging Face Hub does for the files huggingface_hub
asks for (`HF_ENDPOINT` points at it), and safetensors headers without any tensor data.

    HEAD/GET /{org}/{name}/resolve/{revision}/{file}

200 (206 for a Range) with X-Repo-Commit, ETag and Content-Length, as the Hub answers; a
missing repo is 401 RepoNotFound, a gated one 401 without a token and 403 with one (GatedRepo),
a missing revision 404 RevisionNotFound, a missing file 404 EntryNotFound. A safetensors file is
served as its header followed by as many zero bytes as its tensors declare; every byte range
served is recorded, so a test can assert that no weight byte left the server.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "I32": 4, "U8": 1}


def safetensors_header(tensors: dict[str, tuple[str, tuple[int, ...]]]) -> tuple[bytes, int]:
    """(8-byte length + JSON header, bytes of tensor data it declares) for {name: (dtype, shape)}."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offset


@dataclass
class SafetensorsFile:
    head: bytes
    data_bytes: int

    @property
    def size(self) -> int:
        return len(self.head) + self.data_bytes

    def read(self, first: int, last: int) -> bytes:
        head = self.head[first : last + 1]
        return head + b"\0" * (last + 1 - first - len(head))


@dataclass
class Repo:
    files: dict[str, bytes | SafetensorsFile]
    revisions: dict[str, str]  # branch or tag -> commit
    gated: bool = False


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    # (repo, file, first byte, last byte) of every GET that returned safetensors bytes.
    served: list[tuple[str, str, int, int]] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    url: str = ""

    def weight_bytes_served(self) -> int:
        """Bytes served from beyond a safetensors file's header, i.e. tensor data."""
        out = 0
        for repo, name, first, last in self.served:
            head = len(self.repos[repo].files[name].head)  # type: ignore[union-attr]
            out += max(0, last + 1 - max(first, head))
        return out


def commit_of(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _error(self, status: int, code: str) -> None:
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _answer(self, *, body: bool) -> None:
        hub = self.hub
        hub.requests.append((self.command, self.path))
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self.path)
        if m is None:
            return self._error(404, "EntryNotFound")
        repo_id, revision, name = m.groups()
        repo = hub.repos.get(repo_id)
        if repo is None:
            return self._error(401, "RepoNotFound")
        if repo.gated:
            return self._error(403 if self.headers.get("Authorization") else 401, "GatedRepo")
        commit = repo.revisions.get(revision, revision if revision in repo.revisions.values() else None)
        if commit is None:
            return self._error(404, "RevisionNotFound")
        content = repo.files.get(name)
        if content is None:
            return self._error(404, "EntryNotFound")
        size = content.size if isinstance(content, SafetensorsFile) else len(content)
        first, last = 0, size - 1
        ranged = self.headers.get("Range")
        if ranged:
            a, b = re.fullmatch(r"bytes=(\d+)-(\d*)", ranged).groups()  # type: ignore[union-attr]
            first, last = int(a), min(size - 1, int(b) if b else size - 1)
        self.send_response(206 if ranged else 200)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", f'"{commit_of(repo_id + name + commit)}"')
        self.send_header("Content-Length", str(last + 1 - first))
        if ranged:
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        self.end_headers()
        if not body:
            return
        if isinstance(content, SafetensorsFile):
            hub.served.append((repo_id, name, first, last))
            self.wfile.write(content.read(first, last))
        else:
            self.wfile.write(content[first : last + 1])


def serve(hub: FakeHub) -> tuple[ThreadingHTTPServer, threading.Thread]:
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def llama_tensors(config: dict, dtype: str = "BF16") -> dict[str, tuple[str, tuple[int, ...]]]:
    """The tensors (names and shapes) of a Llama-shaped checkpoint for this config.json (Mixtral's
    experts when it has num_local_experts)."""
    h, v, inter = config["hidden_size"], config["vocab_size"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    hd = config.get("head_dim") or h // heads
    out: dict[str, tuple[str, tuple[int, ...]]] = {"model.embed_tokens.weight": (dtype, (v, h))}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": (dtype, (heads * hd, h)),
            p + "self_attn.k_proj.weight": (dtype, (kv * hd, h)),
            p + "self_attn.v_proj.weight": (dtype, (kv * hd, h)),
            p + "self_attn.o_proj.weight": (dtype, (h, heads * hd)),
            p + "input_layernorm.weight": (dtype, (h,)),
            p + "post_attention_layernorm.weight": (dtype, (h,)),
        }
        experts = config.get("num_local_experts")
        if experts:
            # Mixtral: a router and every expert's w1 (gate), w3 (up) and w2 (down).
            out[p + "block_sparse_moe.gate.weight"] = (dtype, (experts, h))
            for e in range(experts):
                q = f"{p}block_sparse_moe.experts.{e}."
                out |= {q + "w1.weight": (dtype, (inter, h)), q + "w3.weight": (dtype, (inter, h)), q + "w2.weight": (dtype, (h, inter))}
        else:
            out |= {
                p + "mlp.gate_proj.weight": (dtype, (inter, h)),
                p + "mlp.up_proj.weight": (dtype, (inter, h)),
                p + "mlp.down_proj.weight": (dtype, (h, inter)),
            }
    out["model.norm.weight"] = (dtype, (h,))
    if not config.get("tie_word_embeddings"):
        out["lm_head.weight"] = (dtype, (v, h))
    return out


def sharded(tensors: dict[str, tuple[str, tuple[int, ...]]], shards: int) -> tuple[dict[str, SafetensorsFile], bytes]:
    """({file name: its header-only file}, the index JSON) for a checkpoint split in `shards` files."""
    names = list(tensors)
    files: dict[str, SafetensorsFile] = {}
    weight_map: dict[str, str] = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        head, data = safetensors_header(part)
        files[fname] = SafetensorsFile(head, data)
        weight_map |= {n: fname for n in part}
    index = json.dumps({"metadata": {"total_size": sum(f.data_bytes for f in files.values())}, "weight_map": weight_map}).encode()
    return files, index


def write_cached_repo(cache: Path, repo: str, files: dict[str, bytes], commit: str) -> None:
    """One repo in a Hub cache (HF_HUB_CACHE) as huggingface_hub writes it: blobs/ by etag,
    snapshots/<commit>/ linking to them, refs/main -> commit."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    (root / "blobs").mkdir()
    for name, data in files.items():
        blob = root / "blobs" / commit_of(repo + name)
        blob.write_bytes(data)
        (snap / name).symlink_to(os.path.relpath(blob, snap))


def write_hub_cache(cache: Path, models: dict[str, tuple[bytes, int]], commit: str) -> None:
    """A Hub cache for {repo: (config.json, shards)}: config.json and, when shards > 0, the index
    and header-only safetensors files of a Llama-shaped checkpoint (no weights)."""
    for repo, (config, shards) in models.items():
        files = {"config.json": config}
        if shards:
            shard_files, index = sharded(llama_tensors(json.loads(config)), shards)
            files |= {"model.safetensors.index.json": index, **{n: f.head for n, f in shard_files.items()}}
        write_cached_repo(cache, repo, files, commit)
