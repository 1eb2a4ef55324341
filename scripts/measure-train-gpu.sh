#!/bin/bash
# The training estimate against what PyTorch holds on a CUDA GPU: six random-weight Llama-shaped
# cases (full, checkpointing, fp32, LoRA, pure bf16), one `planner measure-train` each. docs/guides/memory.md's
# table of GPU cases is this script's output.
#
#   bash scripts/measure-train-gpu.sh OUT_DIR [PYTHON]
#
# PYTHON has torch with CUDA and transformers (default: python3); the planner runs as
# `python -m planner` from this checkout, so its own dependencies must be importable there too.
set -u
out=${1:?usage: measure-train-gpu.sh OUT_DIR [PYTHON]}
python=${2:-python3}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) || { echo "nvidia-smi found no GPU" >&2; exit 2; }
# Llama-3.2-1B's shape (its config.json's sizes; no weights needed, the cases draw random ones).
cat > "$out/llama-1b-shape.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
 "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
 "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
 "tie_word_embeddings": true, "torch_dtype": "bfloat16", "hidden_act": "silu"}
JSON
b1=$out/llama-1b-shape.json
b8=$repo/tests/fixtures/model_configs/llama-3.1-8b-instruct.json
failed=0
one() {
  local name=$1; shift
  echo "== $name: $*"
  (cd "$repo" && PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$python" -m planner measure-train --python "$python" \
    --device cuda --random-weights --gpu "$gpu" --output "$out/$name.json" "$@") || failed=1
}
one 1b-full --model "$b1" --micro-batch 4 --seq-len 2048
one 1b-ckpt-full --model "$b1" --micro-batch 4 --seq-len 2048 --checkpointing full
one 1b-fp32-selective --model "$b1" --precision fp32 --micro-batch 2 --seq-len 1024 --checkpointing selective
one 8b-lora-qv-ckpt --model "$b8" --lora-rank 16 --micro-batch 2 --seq-len 4096 --checkpointing full
one 8b-lora-all --model "$b8" --lora-rank 16 --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj \
  --micro-batch 1 --seq-len 2048
one 8b-bf16-adafactor-ckpt --model "$b8" --precision bf16 --optimizer adafactor --micro-batch 1 --seq-len 4096 \
  --checkpointing full
exit $failed
