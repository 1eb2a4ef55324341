"""Pre-flight memory estimate: what fits on a GPU before any server is launched.

    architecture  config.json -> KV layout (GQA/MQA, MLA, sliding and hybrid layers, text_config)
    weights       exact bytes from safetensors headers, or a parameter count from the config
    memory        the working-memory model and the GPU budget vLLM leaves for the KV cache
    kv_pool       blocks, null block, per-request blocks, vLLM's reported tokens and concurrency
    fit           the verdict and the largest max_model_len that fits
    demand        corpus token counts for the corpus-aware concurrency
    plan          one estimate from validated settings
    point         `estimate_point`, which planner sweep calls for each grid point
"""

from planner.estimate.fit import Verdict
from planner.estimate.plan import Estimate, EstimateSettings, estimate
from planner.estimate.point import estimate_point, kv_tokens_relative_error

__all__ = ["Estimate", "EstimateSettings", "Verdict", "estimate", "estimate_point", "kv_tokens_relative_error"]
