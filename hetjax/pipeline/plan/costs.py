"""What a layer, the embedding and the head cost: FLOPs, parameters, memory.

Figures per token of training (forward + backward = 3 x forward). The planner
turns them into seconds with each island's throughput. Only the fields of the
models' ModelConfig contract are read.

Activation memory is what the pipeline executor keeps between a
microbatch's forward and its backward: the residuals of the forward's
pullback (hetjax/pipeline/runtime/stage_program.py), which a remat policy
(models/stage.py REMAT_POLICIES) trades for recomputation in the backward.
The byte counts per layer below are those of the LLaMA/Qwen2 layers of
`models` (jax.eval_shape of a stage's forward pullback, docs/pipeline.md):
RMSNorm keeps an fp32 copy of its input, SwiGLU six tensors of the MLP width;
XLA's attention keeps each head's row of probabilities (seq_len wide), cuDNN
flash attention (CUDA, 16-bit) only a log-sum-exp per head.
"""

from __future__ import annotations

import dataclasses

from hetjax.pipeline.plan import search_memo

# Remat policies the planner costs, by the models' names; "none" keeps every
# residual. `--remat auto` tries AUTO_REMAT in order and takes the first that
# fits: least recompute first.
REMAT_POLICIES = ("none", "dots_all", "dots", "full")
AUTO_REMAT = ("none", "dots", "full")


def layer_params(config) -> int:
    h, d = config.hidden_size, config.head_dim
    q, kv = config.num_heads * d, config.num_kv_heads * d
    attention = h * q + 2 * h * kv + q * h
    if getattr(config, "attention_bias", False):
        attention += q + 2 * kv
    mlp = 3 * h * config.intermediate_size
    return attention + mlp + 2 * h  # + the two RMSNorm scales


def embedding_params(config) -> int:
    return config.vocab_size * config.hidden_size


def head_params(config) -> int:
    """Final norm + LM head. A tied head still holds a copy on its own stage."""
    return config.hidden_size + config.vocab_size * config.hidden_size


def tied_in_one_stage(config, has_embedding: bool, has_head: bool) -> bool:
    """Whether a stage's head is its own embedding's table: a tied model's
    stage holding both holds one table (bench/results/stage_memory_h100x2_xla.json:
    llama3.2-1b's one stage updated 1.236B parameters, not 1.498B)."""
    return has_embedding and has_head and bool(getattr(config, "tie_embeddings", False))


def layer_flops_per_token(config, seq_len: int) -> float:
    # 6 per parameter (fwd 2, bwd 4) plus causal attention scores and values.
    return 6.0 * layer_params(config) + layer_attention_flops_per_token(config, seq_len)


def layer_attention_flops_per_token(config, seq_len: int) -> float:
    """Causal attention's scores and values, forward and backward: forward
    2 matmuls x 2 flops x seq_len/2 positions on average x q width."""
    return 3 * 2 * 2 * (seq_len / 2) * config.num_heads * config.head_dim


def head_flops_per_token(config) -> float:
    # The vocab projection (6 per weight) and softmax cross-entropy (a few per logit).
    return 6.0 * config.hidden_size * config.vocab_size + 10.0 * config.vocab_size


def embedding_flops_per_token(config) -> float:
    # A gather forward and a scatter-add backward: memory bound, costed as a few
    # elementwise passes over the hidden vector.
    return 4.0 * config.hidden_size


# A backward split into B and W takes this much longer than the folded one
# the other schedules run (B and W in one program, split_backward.py): two
# programs instead of one, and every linear's output gradient written by B
# and read back by W. Measured on one H100 (bench/measure_split_backward.py,
# bench/results/split_backward_h100x1.json): 1.05 on llama3-8b's first and
# middle stages, 1.01 on its last, 1.06 on llama3.2-1b.
SPLIT_BACKWARD_COST = 1.05


# The first stage's backward builds its embedding's gradient dense: the
# tokens' gradients scatter-added into a [vocab, hidden] fp32 buffer, beside
# the scatter's own buffers, however few the tokens. Copies of vocab x hidden
# x 4 bytes the backward holds at once: on CUDA about 3 (qwen2-7b's stage-0
# backward on an H100 ran out of memory allocating 6.28 GiB, 3.1 copies;
# 4 x H100 80GB, 2026-11-27); on CPU 1 (XLA's temp bytes of a bf16 stage's
# backward with the embedding against the same stage without it). Platforms
# not measured count as CUDA.
EMBEDDING_GRADIENT_COPIES = {"cpu": 1}
DEFAULT_EMBEDDING_GRADIENT_COPIES = 3
# A stage that folds its weight gradients into its accumulators (one device
# or one tensor-parallel group, no FSDP: split_backward.folds_weight_grads) scatter-adds the embedding's
# gradient into its donated accumulator: on CUDA no copy beside it (XLA's
# temp bytes of llama3.2-3b's first-stage backward_fused, 8 layers under
# remat dots: 0.78 GiB, less than one 1.47 GiB copy; 2 x H100, 2026-11-27).
FOLDED_EMBEDDING_GRADIENT_COPIES = {"cuda": 0}


def embedding_gradient_bytes(config, platform: str, folded: bool = False) -> float:
    """Bytes the embedding stage's backward holds for the embedding's
    gradient on top of its per-token buffers (before a tensor-parallel cut
    over the vocabulary); folded: the stage folds its weight gradients."""
    copies = EMBEDDING_GRADIENT_COPIES.get(platform, DEFAULT_EMBEDDING_GRADIENT_COPIES)
    if folded:
        copies = FOLDED_EMBEDDING_GRADIENT_COPIES.get(platform, copies)
    return float(copies * embedding_params(config) * 4)


# The last stage runs its forward and backward as one program
# (loss_backward), where XLA keeps fewer of a layer's tensors than a
# forward's pullback hands a separate backward: it fuses the element-wise
# work into its consumers and keeps the matmuls' operands. Measured as the
# temp bytes of that program (compiled.memory_analysis(), jax 0.11.2) on
# 2 x H100, bf16, flash attention, no remat, 2026-11-27
# (bench/results/stage_memory_h100x2_xla.json):
# - per layer and token, 1.60 times the 'dots' policy's residuals
#   (llama3.2-3b 28 against 4 layers: 88,408 bytes; llama3.2-1b within 0.6%);
# - of which 7.4 x hidden x compute bytes are held whole by every device of
#   a tensor-parallel group (llama3.2-3b at tp 2: 66,952 bytes per token
#   and layer, the rest cut in two);
# - the head: the logits in fp32 and in the compute dtype (cut over the
#   vocabulary) and 1.7 x hidden x compute bytes.
# Platforms and dtypes not measured keep the pullback's residuals.
FUSED_LAYER_DOTS_SHARE = {"cuda": 1.60}
FUSED_LAYER_WHOLE_HIDDEN = {"cuda": 7.4}
FUSED_HEAD_WHOLE_HIDDEN = {"cuda": 1.7}


def fused_last_stage(
    platform: str, compute_bytes: int, remat: str | None, split_backward: bool, layer_loop: str = "unrolled"
) -> bool:
    """Whether the last stage's memory follows the measured loss_backward
    figures above: a measured platform, 16-bit compute, no remat, unrolled
    layers (a scanned loop stacks its residuals per layer), the backward not
    split (a split one keeps its linears' inputs until W)."""
    return (
        platform in FUSED_LAYER_DOTS_SHARE
        and compute_bytes == 2
        and policy_name(remat) == "none"
        and layer_loop == "unrolled"
        and not split_backward
    )


def tensor_parallel_all_reduce_bytes(config, compute_bytes: int, layers: int) -> float:
    """Bytes per token a tensor-parallel group all-reduces in one layer loop
    of a microbatch, forward and backward: Megatron's cut sums the row-parallel
    outputs (attention's o and the MLP's down projection) in the forward and
    the column-parallel inputs' gradients in the backward, 4 per layer, each
    a hidden-size activation."""
    return 4.0 * layers * config.hidden_size * compute_bytes


def policy_name(remat: str | None) -> str:
    """A remat flag's policy as REMAT_POLICIES names it (None is "none")."""
    name = "none" if remat is None else remat
    if name not in REMAT_POLICIES:
        raise ValueError(f"remat: expected one of {REMAT_POLICIES}, got {remat!r}")
    return name


def uses_flash_attention(config, platform: str, compute_bytes: int) -> bool:
    """Whether the models' attention="auto" runs cuDNN flash attention on
    this platform (models/attention.py): CUDA, 16-bit, head dim a multiple
    of 8 up to 256. Elsewhere XLA's attention keeps the probabilities."""
    return platform == "cuda" and compute_bytes == 2 and config.head_dim % 8 == 0 and config.head_dim <= 256


def _widths(config) -> tuple[int, int, int, int]:
    h, d = config.hidden_size, config.head_dim
    return h, config.num_heads * d, config.num_kv_heads * d, config.intermediate_size


def layer_residual_bytes(config, seq_len: int, compute_bytes: int, remat: str | None, flash: bool) -> float:
    """Bytes per token one layer's forward keeps for its backward under the
    remat policy (per the models' layers; see the module doc)."""
    h, q, kv, inter = _widths(config)
    c = compute_bytes
    policy = policy_name(remat)
    if policy == "full":  # only the layer's input
        return float(h * c)
    # Matmul outputs without batch dims (q, k, v, o, gate, up) and the input.
    dots = (2 * h + q + 2 * kv + 2 * inter) * c
    scores = 0 if flash else config.num_heads * seq_len  # per token: a row of probabilities per head
    if policy == "dots":
        return float(dots)
    if policy == "dots_all":  # + attention's batched matmuls: the fp32 scores
        return float(dots + h * c + 4 * scores)
    # Every residual: fp32 and normed copies for the two RMSNorms, q, k, v and
    # the attention output, six SwiGLU tensors, and the softmax's statistics
    # (flash) or probabilities in fp32 and in the compute dtype (XLA).
    # Flash attention: cuDNN's kernel keeps q, k, v, its output and a
    # log-sum-exp per head, and the forward hands the backward a further
    # q- and k/v-wide copy (XLA's forward output on an H100: llama3.2-3b
    # 172,145 bytes per token and layer, 8,192 more than the tensors above).
    softmax = 4 * config.num_heads + (q + kv) * c if flash else (4 + c) * scores
    return float(8 * h + 4 * h * c + (2 * q + 2 * kv) * c + 6 * inter * c + softmax)


def layer_replicated_bytes(config, compute_bytes: int, remat: str | None) -> float:
    """The part of layer_residual_bytes that tensor parallelism does not cut:
    the hidden-size tensors (the layer's input, the norms' fp32 and normed
    copies, the residual stream after attention), which every device of a
    tensor-parallel group holds whole; the rest (q, k, v, the attention
    output, the MLP's tensors, the scores) is cut over the heads and the
    intermediate size."""
    h, c = config.hidden_size, compute_bytes
    policy = policy_name(remat)
    if policy == "full":
        return float(h * c)
    if policy == "dots":
        return float(2 * h * c)
    if policy == "dots_all":
        return float(3 * h * c)
    return float(8 * h + 4 * h * c)


def layer_recompute_flops(config, seq_len: int, remat: str | None, flash: bool) -> float:
    """FLOPs per token the backward spends recomputing one layer's forward
    under the remat policy: 'full' all of it; 'dots' what is not a weight
    matmul (attention's batched matmuls, softmax, norms, RoPE, SwiGLU);
    'dots_all' the element-wise work (and the attention when it is a flash
    kernel, no matmul to keep)."""
    policy = policy_name(remat)
    if policy == "none":
        return 0.0
    h, q, kv, inter = _widths(config)
    if policy == "full":
        return layer_flops_per_token(config, seq_len) / 3
    attention = 2 * 2 * (seq_len / 2) * q  # scores and values, causal
    softmax = 0 if flash else 5 * config.num_heads * seq_len / 2
    elementwise = 2 * 5 * h + 6 * (q + kv) + 5 * inter + 2 * h  # norms, RoPE, SwiGLU, residual adds
    if policy == "dots":
        return attention + softmax + elementwise
    return (attention if flash else softmax) + elementwise


@dataclasses.dataclass(frozen=True)
class StageCost:
    """Costs of a stage [first, last) with optional embedding and head."""

    flops_per_token: float  # forward + backward, the remat policy's recomputation included
    params: int
    activation_bytes_per_token: float  # kept per in-flight microbatch token
    working_bytes_per_token: float  # needed while one microbatch runs backward
    recompute_flops_per_token: float = 0.0  # the part of flops_per_token that recomputes
    attention_flops_per_token: float = 0.0  # the part of flops_per_token in attention's scores and values
    # The part of the backward a split backward runs as W (zero-bubble
    # schedules): the layers' weight-gradient products, 2 FLOPs per weight.
    weight_flops_per_token: float = 0.0
    # The parts of the activation and working byte counts that every device of a
    # tensor-parallel group holds whole (layer_replicated_bytes).
    activation_replicated_bytes_per_token: float = 0.0
    working_replicated_bytes_per_token: float = 0.0


@search_memo.remembered
def stage_cost(
    config,
    first: int,
    last: int,
    has_embedding: bool,
    has_head: bool,
    seq_len: int,
    compute_bytes: int,
    remat: str | None = None,
    flash: bool = False,
    split_backward: bool = False,
    platform: str = "",
    layer_loop: str = "unrolled",
) -> StageCost:
    """A stage's costs under a remat policy. A stage other than the last
    keeps its forward's residuals for every in-flight microbatch; the last
    runs forward and backward in one program (loss_backward), keeping only
    its input per in-flight microbatch and its residuals while it runs.

    split_backward (zero-bubble schedules, split_backward.py): W is the
    layers' weight-gradient products, except under remat, whose recomputed
    layers stay whole in B; the embedding's and the head's gradients stay in
    B. Until its W, a microbatch keeps its linears' inputs and output
    gradients, counted as its residuals, on the last stage too.

    platform, layer_loop: where the last stage's one program has measured
    figures (fused_last_stage), its working bytes are those."""
    layers = last - first
    recompute = layers * layer_recompute_flops(config, seq_len, remat, flash)
    flops = layers * layer_flops_per_token(config, seq_len) + recompute
    params = layers * layer_params(config)
    h = config.hidden_size
    residuals = layers * layer_residual_bytes(config, seq_len, compute_bytes, remat, flash)
    whole = layers * layer_replicated_bytes(config, compute_bytes, remat)
    # Once per stage: RoPE's cos and sin (fp32); XLA's attention also keeps
    # its causal mask as a bias per head.
    if layers:
        residuals += 8 * config.head_dim
        whole += 8 * config.head_dim
        if policy_name(remat) == "none" and not flash:
            residuals += 5 * config.num_heads * seq_len
    # The backward's own buffers: one layer's residuals (its recomputation
    # under remat, the gradients' temporaries without).
    working = layer_residual_bytes(config, seq_len, compute_bytes, None, flash) if layers else 0.0
    working_whole = layer_replicated_bytes(config, compute_bytes, None) if layers else 0.0
    if has_embedding:
        flops += embedding_flops_per_token(config)
        params += embedding_params(config)
    if has_head:
        flops += head_flops_per_token(config)
        if not tied_in_one_stage(config, has_embedding, has_head):
            params += head_params(config)
        else:
            params += h  # the final norm; the head reads the embedding's table
        # The final norm's residuals, and the fp32 logits (the loss's softmax
        # and gradient fuse into them: one copy measured, docs/pipeline.md).
        residuals += 4 * h + 2 * h * compute_bytes
        whole += 4 * h + 2 * h * compute_bytes
        working += 4 * config.vocab_size  # cut over the vocabulary by tensor parallelism
    kept = 4 if has_embedding else compute_bytes * h  # the stage input: token ids or the activation
    kept_whole = kept
    if has_head and fused_last_stage(platform, compute_bytes, remat, split_backward, layer_loop):
        c = compute_bytes
        layer = FUSED_LAYER_DOTS_SHARE[platform] * layer_residual_bytes(config, seq_len, c, "dots", flash)
        layer_whole = min(layer, FUSED_LAYER_WHOLE_HIDDEN[platform] * h * c)
        head_whole = FUSED_HEAD_WHOLE_HIDDEN[platform] * h * c
        working = layers * layer + (4 + c) * config.vocab_size + head_whole
        working_whole = layers * layer_whole + head_whole
    elif has_head:
        working += residuals
        working_whole += whole
    if not has_head or split_backward:
        kept += residuals
        kept_whole += whole
    splits = split_backward and policy_name(remat) == "none"
    weight = 2.0 * layers * layer_params(config) if splits else 0.0
    return StageCost(
        flops_per_token=flops,
        params=params,
        activation_bytes_per_token=kept,
        working_bytes_per_token=working,
        recompute_flops_per_token=recompute,
        attention_flops_per_token=layers * layer_attention_flops_per_token(config, seq_len),
        weight_flops_per_token=weight,
        activation_replicated_bytes_per_token=kept_whole,
        working_replicated_bytes_per_token=working_whole,
    )
