"""Per-token log-probabilities and entropies of response tokens, chunked so the full logits never exist.

For a batch of ``N`` sequences laid out as ``[left-padded prompt (P columns) | right-padded response (T columns)]``
the policy's next-token distribution at response position ``t`` is

    pi(. | x, y_<t) = softmax(z_t / tau),   z_t = lm_head(h_{P+t-1})

where ``h`` is the transformer body's last hidden state and ``tau`` the sampling temperature (verl divides the
logits by the rollout temperature before log-softmax in the same way, so that the trained log-probabilities are
those of the distribution the responses were sampled from). Returned per token:

    logp[n, t]    = log pi(y_t | x, y_<t) = z_t[y_t]/tau - logsumexp(z_t/tau)
    entropy[n, t] = -sum_v pi(v) log pi(v)   (over the whole vocabulary)

A ``[N, T, V]`` float32 logits tensor is large (16 x 512 x 49,152 x 4 B = 1.6 GB, and log-softmax, its gradient
and the entropy terms each need as much again), so the body is run once and ``lm_head`` + log-softmax are then
applied to chunks of at most ``chunk_size`` positions. Each chunk runs under ``torch.utils.checkpoint``: the
forward keeps only the chunk's hidden states, and the backward recomputes that chunk's logits, so at most one
chunk's ``[chunk_size, V]`` logits (plus their gradient) is alive at a time in forward and backward.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from tepo.prompt_cache import checkpointed_cache_allowed, shared_prompt_hidden

# Default positions per chunk: 2**25 logits (128 MiB in float32 per [chunk, V] tensor); 682 rows at V = 49,152.
_DEFAULT_CHUNK_ELEMENTS = 2**25
# On CUDA, 4x that (512 MiB per [chunk, V]; 883 rows at Qwen's V = 151,936 instead of 220) on a GPU of 24 GiB or
# more, 2x below: at 220-row chunks and 27-row blocks (below) a 1k-token x 128-row batch launches thousands of
# kernels each too small to fill the GPU. The chunk's [chunk, V] logits, their log-probs and gradient are alive
# together (about 3 x 512 MiB), a small share of such a GPU. Chunking only groups rows: every row's values are
# computed by the same per-row operations whatever the size (tests/test_logprob_sizes.py).
_CUDA_CHUNK_ELEMENTS = {"large": 2**27, "small": 2**26}
_CUDA_LARGE_GIB = 24


def default_chunk_size(vocab_size: int, device: torch.device | str | None = None) -> int:
    """Positions per chunk so one float32 ``[chunk, vocab]`` tensor holds about 2**25 elements (128 MiB) on the
    CPU, 2**27 (512 MiB) on a CUDA GPU of 24 GiB or more, 2**26 on a smaller one."""
    return max(1, _chunk_elements(device) // vocab_size)


def _chunk_elements(device) -> int:
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda":
        return _DEFAULT_CHUNK_ELEMENTS
    total = torch.cuda.get_device_properties(device).total_memory if torch.cuda.is_available() else 0
    return _CUDA_CHUNK_ELEMENTS["large" if total >= _CUDA_LARGE_GIB * 2**30 else "small"]


class TokenLogprobs(NamedTuple):
    """Per-token values of a log-prob pass, each ``[N, T]`` (0 at padding): ``logp``, and where asked the entropy
    and ``sum_v pi(v)^2`` (else None)."""

    logp: Tensor
    entropy: Tensor | None = None
    sum_pi_squared: Tensor | None = None


def response_logprobs(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_len: int,
    *,
    compute_entropy: bool = True,
    chunk_size: int | None = None,
    temperature: float = 1.0,
    prompt_groups: Tensor | None = None,
    compute_sum_pi_squared: bool = False,
) -> TokenLogprobs:
    """Log-probabilities ``[N, T]`` of the response tokens and (optionally) the full-vocabulary entropy ``[N, T]``,
    as one :class:`TokenLogprobs` whatever is asked.

    ``compute_sum_pi_squared=True`` (no-grad calls only) adds ``sum_v pi(v)^2`` of ``softmax(logits /
    temperature)`` at each response position (the optimal token baseline's path variance,
    `tepo.advantages.optimal_token_baseline_advantages`); it costs one more ``lm_head`` product per chunk.

    ``input_ids``/``attention_mask`` are ``[N, P+T]``: the last ``response_len`` (= T) columns are the response.
    Position ids come from ``attention_mask`` (``cumsum - 1``), as in transformers' ``generate``, so left padding
    gives the same positions as generation did. Positions whose response ``attention_mask`` is 0 (padding after
    EOS) are not computed and hold 0 in every output. Outputs are float32 (also under autocast) and differentiable
    w.r.t. the model's parameters when grad is enabled. ``chunk_size`` = positions per ``lm_head`` chunk (default
    :func:`default_chunk_size`); ``temperature`` divides the logits (see module docstring).

    ``prompt_groups`` (``[N]`` ints, optional): rows with the same value have the same prompt block (the first
    ``P`` columns of ``input_ids`` and ``attention_mask``), as the G samples of one prompt do. The prompt is then
    run once per group and its keys/values are shared by the group's rows (`tepo.prompt_cache`); the
    result equals the unshared pass up to float rounding, values and gradients (tests/training/test_shared_prompt.py).
    """
    _check_inputs(input_ids, attention_mask, response_len, chunk_size, temperature)
    if compute_sum_pi_squared and torch.is_grad_enabled():
        raise ValueError(
            "compute_sum_pi_squared is for no-grad passes only (wrap the call in torch.no_grad())"
        )
    body, lm_head = _split_model(model)
    prompt_len = input_ids.shape[1] - response_len
    attention_mask = attention_mask.to(input_ids.device)
    response_hidden = _response_hidden(body, input_ids, attention_mask, prompt_len, prompt_groups)
    targets = input_ids[:, prompt_len:]
    valid = attention_mask[:, prompt_len:].bool()

    rows_hidden = response_hidden[valid]  # [M, H], only real response tokens
    rows_targets = targets[valid]
    vocab = lm_head.weight.shape[0] if hasattr(lm_head, "weight") else None
    size = chunk_size or default_chunk_size(vocab or 32_000, rows_hidden.device)
    logp_rows, entropy_rows, pi2_rows = [], [], []
    # Recompute-in-backward is only needed when a graph is being built through the chunk.
    use_checkpoint = torch.is_grad_enabled() and (
        rows_hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters())
    )
    for start in range(0, rows_hidden.shape[0], size):
        args = (rows_hidden[start : start + size], rows_targets[start : start + size])
        fn = _ChunkScorer(lm_head, temperature, compute_entropy)
        if use_checkpoint:
            logp_chunk, entropy_chunk = checkpoint(fn, *args, use_reentrant=False)
        else:
            logp_chunk, entropy_chunk = fn(*args)
        logp_rows.append(logp_chunk)
        entropy_rows.append(entropy_chunk)
        if compute_sum_pi_squared:
            pi2_rows.append(_sum_pi_squared(lm_head(args[0]), temperature))
    return TokenLogprobs(
        _scatter_rows(logp_rows, valid),
        _scatter_rows(entropy_rows, valid) if compute_entropy else None,
        _scatter_rows(pi2_rows, valid) if compute_sum_pi_squared else None,
    )


def _response_hidden(
    body, input_ids, attention_mask, prompt_len: int, prompt_groups: Tensor | None
) -> Tensor:
    """The body's hidden states that predict the response tokens, ``[N, T, H]``: with each group's prompt run
    once where ``prompt_groups`` groups rows (and the shared cache is safe here), else one plain pass."""
    if (
        prompt_groups is not None
        and len(torch.unique(prompt_groups)) < input_ids.shape[0]
        and checkpointed_cache_allowed(body)
    ):
        return shared_prompt_hidden(body, input_ids, attention_mask, prompt_len, prompt_groups)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    hidden = body(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state
    # The hidden state at column j predicts the token at column j + 1.
    return hidden[:, prompt_len - 1 : -1]


def _sum_pi_squared(logits: Tensor, temperature: float) -> Tensor:
    """``sum_v pi(v)^2`` of each row of a chunk's logits, in row blocks (float32)."""
    return torch.cat(
        [
            torch.softmax(logits[rows].float() / temperature, dim=-1).square().sum(-1)
            for rows in _row_blocks(logits)
        ]
    )


class _ChunkScorer:
    """``lm_head`` + temperature + log-softmax on one chunk of hidden states; returns (logp, entropy)."""

    def __init__(self, lm_head, temperature: float, compute_entropy: bool):
        self.lm_head = lm_head
        self.temperature = temperature
        self.compute_entropy = compute_entropy

    def __call__(self, hidden: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        # lm_head runs under whatever autocast is active (bf16 matmul); softmax math is always float32.
        logits = self.lm_head(hidden)
        return _TargetLogpAndEntropy.apply(logits, targets, self.temperature, self.compute_entropy)


# Rows per block of the temporaries in forward and backward (about 2**22 float32 elements, 16 MiB; 27 rows at
# V = 151,936). On CUDA 2**25 (128 MiB, 220 rows there): the blocks only bound temporaries, and 27-row blocks
# are kernels too small for a GPU. Every row is computed alone, so the size never changes a value.
_BLOCK_ELEMENTS = 2**22
_CUDA_BLOCK_ELEMENTS = 2**25


class _TargetLogpAndEntropy(torch.autograd.Function):
    """Target log-probability and entropy of ``softmax(logits / tau)`` per row, with a hand-written backward.

    With ``z = logits / tau``, ``lp = log_softmax(z)`` and ``p = exp(lp)``, per row ``i`` and target ``y_i``::

        logp_i = lp_i[y_i]                       dlogp_i / dz_iv = 1[v = y_i] - p_iv
        H_i    = -sum_v p_iv lp_iv               dH_i / dz_iv    = -p_iv (lp_iv + H_i)

    so for upstream gradients ``a_i`` (of logp) and ``b_i`` (of H)::

        dL/dz_iv = a_i 1[v = y_i] - p_iv (a_i + b_i (lp_iv + H_i)),    dL/dlogits = (dL/dz) / tau

    The values are computed row by row with the same operations as the autograd formulation (``log_softmax``,
    ``gather``, ``-(exp(lp) * lp).sum``), so they are bitwise the same. Why by hand: autograd through
    log_softmax -> exp -> mul -> sum keeps about five ``[rows, V]`` float32 tensors alive at the backward's peak
    (log-probs, their exp, the product, and gradients). Here the only ``[rows, V]`` tensors are the log-probs
    (kept for backward) and the gradient, written in the logits' dtype (bf16 under autocast: half the size);
    every other temporary is a block of rows (:data:`_BLOCK_ELEMENTS`).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float, compute_entropy: bool):
        # Half-precision logits (bf16 autocast) are scored in float32; float32/float64 stay as they are.
        dtype = logits.dtype if logits.dtype in (torch.float32, torch.float64) else torch.float32
        log_probs = torch.empty(logits.shape, dtype=dtype, device=logits.device)
        entropy = (
            torch.empty(logits.shape[:-1], dtype=dtype, device=logits.device) if compute_entropy else None
        )
        for rows in _row_blocks(logits):
            z = logits[rows].to(dtype)
            if temperature != 1.0:
                z = z / temperature
            torch.log_softmax(z, dim=-1, out=log_probs[rows])
            if compute_entropy:
                terms = log_probs[rows].exp()
                entropy[rows] = -terms.mul_(log_probs[rows]).sum(-1)
        logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        if entropy is None:
            entropy = logp.new_zeros(())  # placeholder; checkpoint needs tensors, discarded by the caller
        ctx.save_for_backward(log_probs, targets, entropy)
        ctx.temperature, ctx.compute_entropy, ctx.input_dtype = temperature, compute_entropy, logits.dtype
        return logp, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp: Tensor, grad_entropy: Tensor):
        log_probs, targets, entropy = ctx.saved_tensors
        grad = torch.empty(log_probs.shape, dtype=ctx.input_dtype, device=log_probs.device)
        a = grad_logp.unsqueeze(-1)
        for rows in _row_blocks(log_probs):
            block = log_probs[rows].exp()  # p
            if ctx.compute_entropy:
                factor = log_probs[rows] + entropy[rows].unsqueeze(-1)
                block.mul_(factor.mul_(grad_entropy[rows].unsqueeze(-1)).add_(a[rows]))  # p (a + b (lp + H))
            else:
                block.mul_(a[rows])
            block.neg_().scatter_add_(-1, targets[rows].unsqueeze(-1), a[rows])
            if ctx.temperature != 1.0:
                block.div_(ctx.temperature)
            grad[rows] = block  # cast to the logits' dtype here, a block at a time
        return grad, None, None, None


def _row_blocks(matrix: Tensor):
    elements = _CUDA_BLOCK_ELEMENTS if matrix.device.type == "cuda" else _BLOCK_ELEMENTS
    step = max(1, elements // max(1, matrix.shape[-1]))
    return [slice(start, start + step) for start in range(0, matrix.shape[0], step)]


def _scatter_rows(chunks: list[Tensor], valid: Tensor) -> Tensor:
    """Place per-valid-position values back into an ``[N, T]`` float32 tensor (0 where ``valid`` is False); a
    float64 model's values stay float64 (the exactness tests of the update run in float64)."""
    dtype = torch.float64 if chunks and chunks[0].dtype == torch.float64 else torch.float32
    out = torch.zeros(valid.shape, dtype=dtype, device=valid.device)
    if not chunks:
        return out
    return out.masked_scatter(valid, torch.cat(chunks).to(dtype))


def _split_model(model):
    """The transformer body (returns ``last_hidden_state``) and the output projection of a causal LM."""
    body = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if body is None or body is model or lm_head is None:
        raise TypeError(
            f"response_logprobs needs a Hugging Face causal LM with a decoder body and an lm_head "
            f"(get_decoder() / get_output_embeddings()); got {type(model).__name__}"
        )
    return body, lm_head


def _check_inputs(input_ids, attention_mask, response_len, chunk_size, temperature) -> None:
    if not isinstance(input_ids, Tensor) or input_ids.ndim != 2 or input_ids.dtype != torch.long:
        raise ValueError(
            f"input_ids must be a 2-D torch.long tensor [N, P+T]; got "
            f"{getattr(input_ids, 'dtype', type(input_ids))} of shape {tuple(getattr(input_ids, 'shape', ()))}"
        )
    if not isinstance(attention_mask, Tensor) or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must be a tensor of the same shape as input_ids {tuple(input_ids.shape)}; got "
            f"{tuple(getattr(attention_mask, 'shape', ()))}"
        )
    if isinstance(response_len, bool) or not isinstance(response_len, int):
        raise ValueError(f"response_len must be an int; got {type(response_len).__name__}")
    if not 1 <= response_len < input_ids.shape[1]:
        raise ValueError(
            f"response_len must be in [1, {input_ids.shape[1] - 1}] (at least one prompt column precedes the "
            f"response in input_ids of width {input_ids.shape[1]}); got {response_len}"
        )
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise ValueError(f"chunk_size must be a positive int or None; got {chunk_size!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature!r}")
