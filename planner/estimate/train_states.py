"""Model states of a training run: weights, master copy, gradients and optimizer state, per GPU.

Bytes per parameter (Rajbhandari et al. 2020, "ZeRO", section 3.1: mixed-precision Adam holds
2 + 2 + 12 = 16 bytes per parameter), by precision policy:

    policy       weights          master (trainable)   gradients (trainable)   optimizer state in
    fp32         4                -                    4                       fp32
    bf16-mixed   2                4                    2                       fp32 (on the master)
    bf16         2                -                    2                       bf16 (PyTorch's optimizers
                                                                               keep state in the param dtype)

Optimizer state per trainable tensor of n elements (s = the state's bytes per element):

    adamw      exp_avg + exp_avg_sq: 2 n s, plus a 4-byte step tensor (torch.optim.AdamW)
    sgd        momentum_buffer: n s (torch.optim.SGD with momentum)
    adafactor  factored second moment (Shazeer and Stern 2018): rows + columns of a 2-D tensor
               (r + c) s, the whole n s for a 1-D one, plus a 4-byte step (torch.optim.Adafactor)
    adamw8bit  bitsandbytes' blockwise 8-bit Adam (Dettmers et al. 2022): two uint8 states (2 n)
               plus one fp32 absmax per 256-element block each; tensors under 4,096 elements keep
               32-bit states (bitsandbytes' min_8bit_size)

Sharding over N data-parallel workers (ZeRO stages; PyTorch FSDP's FULL_SHARD is stage 3,
SHARD_GRAD_OP stage 2):

    single, ddp   everything replicated on every worker
    zero1         optimizer state and master copy / N
    zero2         + gradients / N
    zero3, fsdp   + weights / N

Tensor parallelism (Megatron-style) splits 2-D weights over its ranks and replicates 1-D ones;
it applies before the data-parallel sharding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from planner.estimate.train_params import Param

Precision = Literal["fp32", "bf16-mixed", "bf16"]
Optimizer = Literal["adamw", "sgd", "adafactor", "adamw8bit"]
Strategy = Literal["single", "ddp", "zero1", "zero2", "zero3", "fsdp"]

WEIGHT_BYTES: dict[Precision, int] = {"fp32": 4, "bf16-mixed": 2, "bf16": 2}
STATE_BYTES: dict[Precision, int] = {"fp32": 4, "bf16-mixed": 4, "bf16": 2}
# bitsandbytes Optimizer2State.init_state: block_wise quantisation in blocks of 256, and
# parameters with fewer than min_8bit_size = 4096 elements keep 32-bit state.
BNB_BLOCK = 256
BNB_MIN_8BIT_SIZE = 4096
STEP_TENSOR_BYTES = 4

# Which model states each strategy divides by the data-parallel size.
SHARDED: dict[Strategy, frozenset[str]] = {
    "single": frozenset(),
    "ddp": frozenset(),
    "zero1": frozenset({"optimizer", "master"}),
    "zero2": frozenset({"optimizer", "master", "gradients"}),
    "zero3": frozenset({"optimizer", "master", "gradients", "weights"}),
    "fsdp": frozenset({"optimizer", "master", "gradients", "weights"}),
}


@dataclass(frozen=True)
class ModelStates:
    """Bytes on one GPU."""

    weights_bytes: int
    master_weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.master_weights_bytes + self.gradients_bytes + self.optimizer_bytes


def optimizer_state_bytes(optimizer: Optimizer, shape: tuple[int, ...], numel: int, state_bytes: int) -> int:
    match optimizer:
        case "adamw":
            return 2 * numel * state_bytes + STEP_TENSOR_BYTES
        case "sgd":
            return numel * state_bytes
        case "adafactor":
            if len(shape) >= 2:
                rows, cols = shape[-2], shape[-1]
                lead = math.prod(shape[:-2])
                return lead * (rows + cols) * state_bytes + STEP_TENSOR_BYTES
            return numel * state_bytes + STEP_TENSOR_BYTES
        case "adamw8bit":
            if numel < BNB_MIN_8BIT_SIZE:
                return 2 * numel * 4 + STEP_TENSOR_BYTES
            return 2 * (numel + 4 * (numel // BNB_BLOCK + 1)) + STEP_TENSOR_BYTES


def model_states(
    params: list[Param],
    *,
    precision: Precision,
    optimizer: Optimizer,
    strategy: Strategy,
    data_parallel: int,
    tp: int,
    num_kv_heads: int,
) -> ModelStates:
    w_bytes = WEIGHT_BYTES[precision]
    s_bytes = STATE_BYTES[precision]
    weights = master = grads = opt = steps = 0
    for p in params:
        n = p.per_rank(tp, num_kv_heads)
        weights += n * w_bytes
        if not p.trains:
            continue
        grads += n * w_bytes
        if precision == "bf16-mixed":
            master += n * 4
        shape = p.shape if tp <= 1 else (n,) if len(p.shape) < 2 else (p.shape[0], math.ceil(n / p.shape[0]))
        state = optimizer_state_bytes(optimizer, shape, n, s_bytes)
        # Every worker keeps each tensor's step counter whole, even when the state is sharded.
        step = STEP_TENSOR_BYTES if optimizer != "sgd" else 0
        opt += state - step
        steps += step
    sharded = SHARDED[strategy]

    def per_gpu(name: str, value: int) -> int:
        return math.ceil(value / data_parallel) if name in sharded else value

    return ModelStates(
        weights_bytes=per_gpu("weights", weights),
        master_weights_bytes=per_gpu("master", master),
        gradients_bytes=per_gpu("gradients", grads),
        optimizer_bytes=per_gpu("optimizer", opt) + steps,
    )
