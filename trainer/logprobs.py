"""Token log-probs and entropies of responses without a full [B, T, V] float32 log-softmax.

The model's backbone runs once; the LM head then runs over the response positions in
chunks of `chunk_tokens` rows, each chunk upcast to float32 and reduced to (log-prob,
entropy) immediately. Under a bf16 compute dtype the head weight is cast inside each chunk
from its float32 master, so its gradient is summed over chunks in float32 (cast once
outside, it would be summed in bf16: ~1.2% error at a 152k vocabulary instead of ~0.3%). Under autograd each chunk is checkpointed, so its [chunk, V] logits
are recomputed in backward instead of kept: peak memory is O(chunk * V), not O(B * T * V)
(perf/logprob_memory.py measures it against the naive path).

Legend: B sequences, P prompt length (left-padded), T response length (right-padded),
L = P + T, H hidden size, V vocabulary, N = B * T flattened response positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from common.generation.hf import prefill_shared

# CPU: rows per chunk = CHUNK_ELEMENTS // V (at least MIN_CHUNK_TOKENS): each float32
# [chunk, V] buffer is then ~8 MiB, and a chunk's forward+backward holds ~a dozen of them
# (logits, softmax, entropy product, their gradients). 32k vocab -> 64 rows; 152k -> 32.
CHUNK_ELEMENTS = 2**21
MIN_CHUNK_TOKENS = 32
# GPU: every chunk re-reads the whole [V, H] head, so tiny chunks make the head memory-bound
# (32 rows at 152k vocab: ~1.6 s per 32k-token micro-batch on an H100, by arithmetic).
# ~1 GiB float32 logits per chunk (a chunk's backward holds ~8 such buffers), clamped to
# 2k-8k rows (verl chunks its entropy at 2,048 rows): 152k vocab -> 2,048 rows, 16 chunks
# per 32k-token micro-batch instead of 1,024; 32k vocab -> 8,192.
GPU_CHUNK_ELEMENTS = 2**28
GPU_CHUNK_BUFFERS = 8  # float32 [chunk, V] buffers alive in a chunk's backward (sizing)
GPU_CHUNK_TOKENS = (2048, 8192)


def auto_chunk_tokens(vocab_size: int, device_type: str = "cpu") -> int:
    """Rows of the LM head per chunk for a vocabulary on a device type ("cpu", "cuda")."""
    if device_type == "cpu":
        return max(MIN_CHUNK_TOKENS, CHUNK_ELEMENTS // vocab_size)
    low, high = GPU_CHUNK_TOKENS
    return min(high, max(low, GPU_CHUNK_ELEMENTS // vocab_size))


@dataclass
class PackedBatch:
    """Prompts left-padded to P, responses right-padded to T, side by side: every response
    starts at column P, so the logits predicting it are columns P-1 .. P+T-2."""

    input_ids: torch.Tensor  # (B, L) long
    attention_mask: torch.Tensor  # (B, L) long
    response_mask: torch.Tensor  # (B, T) float, 1 on response tokens (EOS included)
    prompt_len: int  # P

    @property
    def response_ids(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_len :]  # (B, T)

    @property
    def prompt_lengths(self) -> torch.Tensor:
        return self.attention_mask[:, : self.prompt_len].sum(-1)  # (B,)

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1).long()  # (B,)

    def rows(self, idx) -> PackedBatch:
        """The sub-batch of rows `idx`, trimmed to its own longest prompt and response, so
        a micro-batch of short rows carries no padding from longer rows elsewhere. Its
        response columns are the first `response_mask.shape[1]` columns of this batch's."""
        ids, attn, rmask = self.input_ids[idx], self.attention_mask[idx], self.response_mask[idx]
        P = self.prompt_len
        p = int(attn[:, :P].sum(-1).max())
        t = max(1, int(rmask.sum(-1).max()))
        return PackedBatch(ids[:, P - p : P + t], attn[:, P - p : P + t], rmask[:, :t], p)

    def to(self, device) -> PackedBatch:
        return PackedBatch(self.input_ids.to(device), self.attention_mask.to(device),
                           self.response_mask.to(device), self.prompt_len)


def micro_batches(
    batch: PackedBatch, rows: torch.Tensor, max_rows: int, max_tokens: int | None = None,
    padding_free: bool = False,
) -> list[torch.Tensor]:
    """Split `rows` (indices into `batch`) into micro-batches for forward/backward.

    max_tokens None: consecutive chunks of `max_rows` rows. Otherwise token budgets, as
    verl's dynamic batch size: rows sorted by length (longest first) are packed greedily
    while the micro-batch's tokens stay within `max_tokens` (and rows within `max_rows`):
    rows x (longest prompt + longest response) when padded, the sum of the rows' lengths
    when `padding_free`. A row longer than the budget goes alone. Losses are re-weighted
    per micro-batch by the caller, so the gradient does not depend on the grouping.
    """
    if max_tokens is None:
        return [rows[i : i + max_rows] for i in range(0, len(rows), max_rows)]
    p_len = batch.prompt_lengths[rows].tolist()
    t_len = batch.response_lengths[rows].clamp_min(1).tolist()
    order = sorted(range(len(rows)), key=lambda i: p_len[i] + t_len[i], reverse=True)
    groups: list[list[int]] = []
    p_max = t_max = total = 0
    for i in order:
        p_new, t_new = max(p_max, p_len[i]), max(t_max, t_len[i])
        cost = (total + p_len[i] + t_len[i] if padding_free
                else (len(groups[-1]) + 1 if groups else 1) * (p_new + t_new))
        if groups and len(groups[-1]) < max_rows and cost <= max_tokens:
            groups[-1].append(i)
            p_max, t_max, total = p_new, t_new, total + p_len[i] + t_len[i]
        else:
            groups.append([i])
            p_max, t_max, total = p_len[i], t_len[i], p_len[i] + t_len[i]
    return [rows[torch.tensor(g, dtype=torch.long, device=rows.device)] for g in groups]


def balanced_share(batch: PackedBatch, rows: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank `rank`'s rows of `rows` when `size` ranks split them by token count.

    Longest first (ties by position), each row goes to the rank with the fewest tokens so
    far (prompt + response, the forward's cost; ties to the lowest rank): every rank holds
    the whole batch, so each computes the same partition with no collective, and the
    ranks' token totals differ by at most one row's. Size 1: `rows` unchanged.
    """
    if size == 1:
        return rows
    cost = (batch.prompt_lengths[rows] + batch.response_lengths[rows].clamp_min(1)).tolist()
    order = sorted(range(len(rows)), key=lambda i: (-cost[i], i))
    load, mine = [0] * size, []
    for i in order:
        target = min(range(size), key=lambda r: (load[r], r))
        load[target] += cost[i]
        if target == rank:
            mine.append(i)
    return rows[torch.tensor(sorted(mine), dtype=torch.long, device=rows.device)]


def padded_tokens(batch: PackedBatch, groups: list[torch.Tensor]) -> int:
    """Token positions a forward pass over `groups` processes (rows x trimmed width)."""
    total = 0
    for g in groups:
        sub = batch.rows(g)
        total += sub.input_ids.numel()
    return total


def pack(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> PackedBatch:
    """Pack token lists (one prompt per response, repeated as needed) into a PackedBatch."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    P = max(len(p) for p in prompts)
    T = max(1, max(len(r) for r in responses))
    B = len(prompts)
    ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + T), dtype=torch.long)
    rmask = torch.zeros((B, T), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attn[i, P - len(p) : P] = 1
        if r:
            ids[i, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
            attn[i, P : P + len(r)] = 1
            rmask[i, : len(r)] = 1.0
    return PackedBatch(ids, attn, rmask, P)


def _chunk_stats(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
    inv_temp: float, with_entropy: bool, compute_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h (n, H), weight (V, H), targets (n,) -> log-prob (n,) and entropy (n,), float32
    (float64 for float64 inputs: the exact tests). The entropy keeps its graph, so an entropy
    bonus's gradient is recomputed per chunk like the log-prob's.

    `compute_dtype`: h, weight and bias are cast to it here, inside the chunk, so the
    gradient reaching the (float32) weight is one float32 tensor per chunk."""
    if compute_dtype is not None:
        h, weight = h.to(compute_dtype), weight.to(compute_dtype)
        bias = None if bias is None else bias.to(compute_dtype)
    logits = torch.nn.functional.linear(h, weight, bias)  # (n, V)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 up, f64 kept
    if inv_temp != 1.0:
        logits = logits * inv_temp
    lse = torch.logsumexp(logits, dim=-1)  # (n,)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - (probs * logits).sum(-1)
    else:
        entropy = torch.zeros_like(lse)
    return logp, entropy


def head_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
    bias: torch.Tensor | None = None, temperature: float = 1.0, chunk_tokens: int | None = None,
    with_entropy: bool = False, compute_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden (N, H), weight (V, H), targets (N,) -> (log-prob (N,), entropy (N,)), float32.

    Chunks of `chunk_tokens` rows (None: auto_chunk_tokens(V, hidden's device type));
    checkpointed per chunk when gradients are needed. `compute_dtype` (e.g. bf16): the
    GEMM's dtype, cast per chunk (`_chunk_stats`); None computes in the inputs' dtype.
    """
    chunk_tokens = chunk_tokens or auto_chunk_tokens(weight.shape[0], hidden.device.type)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    inv_temp = 1.0 / temperature
    logps, ents = [], []
    # split (not slicing): its backward concatenates the chunk gradients once instead of
    # materialising a zero-padded (N, H) gradient per chunk.
    for h, t in zip(hidden.split(chunk_tokens), targets.split(chunk_tokens)):
        if grad:
            lp, ent = checkpoint(_chunk_stats, h, weight, bias, t, inv_temp, with_entropy,
                                 compute_dtype, use_reentrant=False)
        else:
            lp, ent = _chunk_stats(h, weight, bias, t, inv_temp, with_entropy, compute_dtype)
        logps.append(lp)
        ents.append(ent)
    return torch.cat(logps), torch.cat(ents)


def _padded_states(backbone, batch: PackedBatch) -> torch.Tensor:
    """(B, T, H): the hidden states that predict the response tokens, from the padded batch."""
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp_min(0)  # (B, L) as in generate
    hidden = backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      position_ids=position_ids, use_cache=False).last_hidden_state  # (B, L, H)
    P, T = batch.prompt_len, batch.response_mask.shape[1]
    return hidden[:, P - 1 : P + T - 1]


def _packed_states(backbone, batch: PackedBatch) -> torch.Tensor:
    """(B, T, H) as `_padded_states`, computed padding-free: every row's real tokens are
    concatenated into one sequence whose position ids restart at 0 per row, with no attention
    mask. FlashAttention-2 then runs variable-length attention over the rows; sdpa and eager
    get a block-diagonal causal mask that transformers builds from the position ids. No
    padding token is computed. Rows are contiguous in `attention_mask` (left-padded prompt,
    then the response), so a row-major selection keeps each row's tokens together."""
    from trainer import attention  # transformers: not when the DAG build reads the sizes here

    real = batch.attention_mask.bool()
    input_ids = batch.input_ids[real][None]  # (1, N)
    position_ids = (batch.attention_mask.cumsum(-1) - 1)[real][None]  # (1, N)
    hidden = backbone(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                      **attention.packing_kwargs(backbone, position_ids)
                      ).last_hidden_state[0]  # (N, H)
    lengths = real.sum(-1)  # (B,)
    starts = lengths.cumsum(0) - lengths
    T = batch.response_mask.shape[1]
    # the state predicting response token j of row i: its prompt's last token, then onwards
    index = (starts + batch.prompt_lengths - 1)[:, None] + torch.arange(T, device=hidden.device)
    index = torch.minimum(index, (starts + lengths - 1)[:, None])  # padding: any own state
    return hidden[index]  # (B, T, H)


def distinct_prompts(batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """One row index per distinct prompt (U,) and each row's prompt number into them (B,):
    a rollout's n rows of a group share one prompt."""
    P = batch.prompt_len
    key = torch.cat([batch.input_ids[:, :P], batch.attention_mask[:, :P]], dim=-1)  # (B, 2P)
    distinct, prompt_of = torch.unique(key, dim=0, return_inverse=True)  # (U, 2P), (B,)
    rows = torch.arange(len(prompt_of), device=prompt_of.device)
    first = torch.full((len(distinct),), len(prompt_of), device=prompt_of.device)
    return first.scatter_reduce(0, prompt_of, rows, "amin"), prompt_of


def _shared_prompt_states(backbone, batch: PackedBatch) -> torch.Tensor:
    """(B, T, H) as `_padded_states`, with each distinct prompt computed once (as the hf
    engine's prefill is): the backbone runs on the U distinct prompts (U, P) into a KV
    cache copied to the B rows (`prefill_shared`), then the responses (B, T) run on it.
    The same function as the padded pass from U*P + B*T instead of B*(P+T) token
    positions; other matmul shapes, so other last bits."""
    P, T = batch.prompt_len, batch.response_mask.shape[1]
    first, prompt_of = distinct_prompts(batch)  # (U,), (B,)
    attn = batch.attention_mask  # (B, P + T)
    position_ids = (attn.cumsum(-1) - 1).clamp_min(0)  # (B, P + T) as in generate
    out, cache = prefill_shared(backbone, batch.input_ids[first, :P], attn[first, :P],
                                position_ids[first, :P], prompt_of)
    last = out.last_hidden_state[:, -1][prompt_of]  # (B, H): left padding ends prompts at P-1
    # All T response tokens, though the last one's state predicts nothing: every forward
    # then makes the same two backbone calls, which FSDP2's collectives need on every rank.
    rest = backbone(input_ids=batch.input_ids[:, P:], attention_mask=attn,
                    position_ids=position_ids[:, P:], past_key_values=cache,
                    use_cache=True).last_hidden_state  # (B, T, H)
    return torch.cat([last[:, None], rest[:, : T - 1]], dim=1)


def response_logprobs(
    model, batch: PackedBatch, *, temperature: float = 1.0, chunk_tokens: int | None = None,
    with_entropy: bool = False, autocast: torch.dtype | None = None, padding_free: bool = False,
    share_prompt: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (B, T) of the response tokens under `model` (and entropies (B, T)), float32,
    zero off `batch.response_mask`. Gradients flow when grad mode is on.

    `temperature` divides the logits, matching the sampler's distribution. `padding_free`:
    one concatenated sequence instead of a padded batch (`_packed_states`); `share_prompt`:
    each distinct prompt once (`_shared_prompt_states`).
    """
    backbone, head = model.get_decoder(), model.get_output_embeddings()
    if backbone is None or head is None:
        raise TypeError(f"{type(model).__name__} exposes no get_decoder()/get_output_embeddings()")
    if padding_free and share_prompt:
        raise ValueError("padding_free and share_prompt are two ways to skip work; pick one")
    device = batch.input_ids.device
    states = (_packed_states if padding_free else _shared_prompt_states if share_prompt
              else _padded_states)
    with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
        h = states(backbone, batch)  # (B, T, H)
    B, T, H = h.shape
    h = h.reshape(B * T, H)  # (N, H)
    # the head weight stays the float32 master here: head_logprobs casts it per chunk
    logp, ent = head_logprobs(
        h, head.weight, batch.response_ids.reshape(B * T), bias=getattr(head, "bias", None),
        temperature=temperature, chunk_tokens=chunk_tokens, with_entropy=with_entropy,
        compute_dtype=autocast,
    )
    mask = batch.response_mask
    return logp.view(B, T) * mask, ent.view(B, T) * mask


def naive_response_logprobs(model, batch: PackedBatch, temperature: float = 1.0):
    """Reference path (tests, perf scripts): full logits, float32 log-softmax over (B, T, V)."""
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp_min(0)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   position_ids=position_ids, use_cache=False).logits  # (B, L, V)
    P, T = batch.prompt_len, batch.response_mask.shape[1]
    logits = logits[:, P - 1 : P + T - 1]  # (B, T, V)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    logp_all = torch.log_softmax(logits / temperature, -1)
    logp = logp_all.gather(-1, batch.response_ids[..., None]).squeeze(-1)  # (B, T)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp * batch.response_mask, entropy * batch.response_mask


class PolicyLogProbs(torch.nn.Module):
    """A causal LM whose forward is `response_logprobs`.

    Why a module: the chunked path reads the embedding, final norm and LM head directly
    instead of calling the model's forward; under FSDP2 those parameters belong to the root
    unit, whose hooks run around the root's forward. Making this wrapper the root puts the
    whole log-prob computation inside one forward, so FSDP2 gathers and reduces them.
    """

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def get_decoder(self):
        return self.model.get_decoder()

    def forward(self, batch: PackedBatch, *, temperature: float = 1.0, with_entropy: bool = False,
                autocast: torch.dtype | None = None, padding_free: bool = False,
                share_prompt: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        return response_logprobs(self.model, batch, temperature=temperature,
                                 with_entropy=with_entropy, autocast=autocast,
                                 padding_free=padding_free, share_prompt=share_prompt)
