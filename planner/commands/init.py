"""`planner init`: a commented sweep.toml whose grid the estimate chose, and the command to run it."""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.cliargs import env_default
from planner.errors import ConfigError
from planner.sweep.starter import choose, starter_toml


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "init",
        help="write a first sweep.toml for a model on a GPU, its grid chosen by the estimate",
        description=(
            "Estimate the model on the GPU, choose the tensor-parallel sizes worth trying, the context lengths that fit and"
            " two memory utilisations, and write them to a commented sweep file with the points the estimate would prune."
        ),
    )
    p.add_argument("--model", required=True, help="Hub name (org/name[@revision]) or local model folder, as for vllm serve")
    p.add_argument("--gpu", default=env_default("PLANNER_GPU"), help="the GPU: H100, A100-80GB, L4, nvidia-smi's name... (env PLANNER_GPU)")
    p.add_argument("--prompts", type=Path, default=None, help="corpus JSONL: context lengths start at its longest request")
    p.add_argument("--output", type=Path, default=Path("sweep.toml"), help="the file to write (default sweep.toml)")
    p.add_argument("--force", action="store_true", help="overwrite the file if it exists")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.gpu is None:
        raise ConfigError("--gpu is required (or PLANNER_GPU): the grid depends on the GPU's memory")
    if args.output.exists() and not args.force:
        raise ConfigError(f"{args.output} exists; give --force to overwrite it, or another --output")
    starter = choose(args.model, args.gpu, args.prompts)
    text = starter_toml(starter, output=args.output, prompts=args.prompts)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.output.with_name(args.output.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(args.output)
    kept = starter.points - len(starter.pruned)
    print(f"wrote {args.output}: {starter.points} points, {kept} to run ({len(starter.pruned)} ruled out by the estimate)")
    print(f"see each command: planner sweep --config {args.output} --dry-run")
    print(f"run it:           planner sweep --config {args.output} --output results/sweep")
    return 0
