#!/usr/bin/env bash
# Builds (or reuses) the tiny random-weight Llama the CPU demo and the e2e tests serve with vLLM.
#
#   scripts/build-tiny-model.sh DIR
#
# The builder needs torch, transformers and tokenizers, which live in vLLM's environment, not the
# planner's. Which python runs it:
#   PLANNER_VLLM_PYTHON          if set;
#   VLLM_VENV/bin/python         (default .venv-vllm) if it exists;
#   python3                      if `vllm` is on PATH and python3 imports transformers (a GPU box).
# A second run with a complete build in DIR returns at once.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
out=$1
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${VLLM_VENV:-$root/.venv-vllm}

if [ -n "${PLANNER_VLLM_PYTHON:-}" ]; then
  python=$PLANNER_VLLM_PYTHON
elif [ -x "$venv/bin/python" ]; then
  python=$venv/bin/python
elif command -v vllm >/dev/null 2>&1 && python3 -c "import transformers, tokenizers, torch" >/dev/null 2>&1; then
  python=python3
else
  echo "build-tiny-model: no python with torch, transformers and tokenizers found." >&2
  echo "  Run scripts/setup-vllm.sh (make vllm), or set PLANNER_VLLM_PYTHON to a python that has them." >&2
  exit 2
fi

# The progress bar transformers prints while writing weights is noise in a build log.
HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error \
  exec "$python" "$root/scripts/tinymodel.py" --out "$out"
