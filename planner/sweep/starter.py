"""A first sweep.toml for a model and a GPU, its grid chosen by the estimate (`planner init`).

    tensor parallel   the smallest size (1, 2, 4, 8 that divides the heads) at which the shortest
                      useful context fits, and twice that: is the second half worth its GPUs?
    context lengths   the shortest useful one (the corpus's longest request, else 4096), the
                      longest that fits at the largest size, and one between
    memory            gpu_memory_utilization 0.9 and 0.95
    pruned            every point the estimate rules out, with its reason, as the sweep will

The choice is pure given the estimates; `starter_toml` renders it with a comment per decision.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import ConfigError
from planner.estimate import Estimate, estimate_point
from planner.estimate.demand import estimated_prompt_tokens
from planner.estimate.gpu_catalog import lookup
from planner.estimate.model_source import resolve_model
from planner.estimate.units import format_bytes
from planner.sweep.predict import should_skip
from replay.corpus.jsonl import load_corpus, request_text
from replay.slo.rules import DEFAULT_SLO

CONTEXT_LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)
TP_SIZES = (1, 2, 4, 8)
UTILIZATIONS = (0.9, 0.95)


@dataclass
class Starter:
    model: str
    revision: str | None
    gpu: str
    tensor_parallel_sizes: list[int]
    max_model_lens: list[int]
    utilizations: list[float]
    # Why the grid is what it is, one comment line each.
    reasons: list[str] = field(default_factory=list)
    # "tp=.., max_model_len=.., gpu_memory_utilization=..: reason" for each point the estimate prunes.
    pruned: list[str] = field(default_factory=list)
    points: int = 0


def _estimate(model: str, gpu: str, tp: int, length: int, util: float) -> Estimate:
    flags = {"tensor_parallel_size": tp, "max_model_len": length, "gpu_memory_utilization": util}
    return estimate_point(model, flags, gpu=gpu)


def longest_request(prompts: Path) -> int:
    """The corpus's longest request in tokens (prompt estimated as UTF-8 bytes / 4, plus max_tokens)."""
    return max(estimated_prompt_tokens(request_text(r)) + (r.max_tokens or 0) for r in load_corpus(prompts).requests)


def choose(model: str, gpu: str, prompts: Path | None = None) -> Starter:
    """The grid for `model` on `gpu`. Raises ConfigError when it fits on no size up to 8 GPUs."""
    gpu_name = lookup(gpu).name
    source = resolve_model(model)
    arch = source.architecture()
    longest_ctx = arch.max_position_embeddings or max(CONTEXT_LENGTHS)
    candidates = sorted({n for n in CONTEXT_LENGTHS if n <= longest_ctx} | {longest_ctx})
    starter = Starter(model=model, revision=source.revision, gpu=gpu_name, tensor_parallel_sizes=[], max_model_lens=[], utilizations=list(UTILIZATIONS))
    shortest = candidates[0]
    if prompts is not None:
        need = longest_request(prompts)
        useful = [n for n in candidates if n >= need]
        if not useful:
            raise ConfigError(f"{prompts}: its longest request (~{need} tokens) is longer than the model's {longest_ctx}-token context")
        shortest = useful[0]
        starter.reasons.append(f"context lengths from {shortest}: the corpus's longest request is ~{need} tokens (UTF-8 bytes / 4 + max_tokens)")
    sizes = [tp for tp in TP_SIZES if arch.num_attention_heads % tp == 0]
    first = next((tp for tp in sizes if _estimate(model, gpu_name, tp, shortest, UTILIZATIONS[0]).verdict.status == "fits"), None)
    if first is None:
        raise ConfigError(f"{model} does not fit on up to {sizes[-1]} x {gpu_name} even at max_model_len {shortest}; a larger GPU or a quantised checkpoint is needed")
    tps = [first] + [tp for tp in sizes if tp == 2 * first]
    starter.tensor_parallel_sizes = tps
    weights = _estimate(model, gpu_name, first, shortest, UTILIZATIONS[0]).weights
    smaller = f"; at {first // 2 if first > 1 else 0} it does not fit" if first > 1 else ""
    starter.reasons.append(
        f"tensor parallel {' and '.join(map(str, tps))}: {first} is the fewest GPUs it fits on "
        f"({format_bytes(weights.per_gpu_bytes)} of weights per GPU{smaller})"
        + (f", {tps[-1]} tells whether twice the GPUs carry more than twice the requests" if len(tps) > 1 else "")
    )
    fitting = [n for n in candidates if n >= shortest and _estimate(model, gpu_name, tps[-1], n, UTILIZATIONS[-1]).verdict.status == "fits"]
    picked = sorted({fitting[0], fitting[len(fitting) // 2], fitting[-1]})
    starter.max_model_lens = picked
    starter.reasons.append(
        f"max_model_len {', '.join(map(str, picked))}: from the shortest useful to the longest that fits at tensor parallel "
        f"{tps[-1]} (the model allows {longest_ctx})"
    )
    starter.reasons.append("gpu_memory_utilization 0.9 and 0.95: vLLM's default is 0.9; 0.95 buys KV cache at the cost of headroom")
    for tp in tps:
        for n in picked:
            for util in UTILIZATIONS:
                starter.points += 1
                why = should_skip(_estimate(model, gpu_name, tp, n, util).verdict, prune=True)
                if why:
                    starter.pruned.append(f"tensor_parallel_size {tp}, max_model_len {n}, gpu_memory_utilization {util}: {why}")
    return starter


def _relative(path: Path, to: Path) -> str:
    """`path` as the sweep file will resolve it: relative to the file when both are local."""
    rel = os.path.relpath(path.resolve(), to.resolve().parent)
    if rel.startswith("../../"):
        # Far from the file: a relative path would be fragile.
        return str(path.resolve())
    return rel if rel.startswith("../") else "./" + rel


def starter_toml(s: Starter, *, output: Path, prompts: Path | None) -> str:
    at = f" at commit {s.revision}" if s.revision else ""
    lines = [
        f"# A first sweep for {s.model}{at} on {s.gpu}, written by `planner init`.",
        "# The grid was chosen by the pre-flight estimate:",
        *[f"#   - {r}" for r in s.reasons],
    ]
    if s.pruned:
        lines.append(f"# Of its {s.points} points the estimate rules out {len(s.pruned)}; the sweep prunes them too ([estimate] prune):")
        lines += [f"#   - {p}" for p in s.pruned]
    else:
        lines.append(f"# The estimate expects all {s.points} points to start.")
    lines.append(f"# See every command first: planner sweep --config {output} --dry-run")
    lines.append("")
    if prompts is not None:
        lines.append(f"prompts = {json.dumps(_relative(prompts, output))}")
    else:
        lines.append('# Your own prompts make the answer yours: `planner prompts` converts a corpus to this format.')
        lines.append('prompts = "prompts/prod.jsonl"')
    lines += [
        "",
        "[server]",
        f"model = {json.dumps(s.model)}",
        'args = ["--disable-uvicorn-access-log"]',
        "",
        "[grid]",
        f"max_model_len = {json.dumps(s.max_model_lens)}",
        f"gpu_memory_utilization = {json.dumps(s.utilizations)}",
    ]
    if s.tensor_parallel_sizes != [1]:
        lines.append(f"tensor_parallel_size = {json.dumps(s.tensor_parallel_sizes)}")
    lines += ["", "[slo]", "# The planner's defaults; set your own bounds."]
    lines += [f"{key} = {value:g}" for key, value in DEFAULT_SLO.items()]
    lines += ["headroom = 0.1", "", "[estimate]", "# The GPU's memory for the estimate when nvidia-smi cannot tell.", f"gpu = {json.dumps(s.gpu)}", ""]
    return "\n".join(lines)
