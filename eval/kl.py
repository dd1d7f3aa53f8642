"""KL from the initial model, per evaluated checkpoint, on its own evaluation samples.

The quantity: the sequence-level KL(q_ckpt || q_init) between the distributions the
evaluation samples its responses from, q = softmax(logits / temperature) over the full
vocabulary at every token (top_p = 1, top_k off: `common.generation.hf.
sampling_generation_config`, the vLLM engine's sampling params). At the shipped settings
(temperature 1, top_p 1) q is the model itself, so this is KL(pi_ckpt || pi_init), the
quantity a KL-regularized trainer trades reward against. The samples are draws of q_ckpt,
so the plain mean of a per-sample estimate is unbiased for it, no importance weight needed.
With top_p < 1 the nucleus of the initial model can exclude a token the checkpoint sampled
(that KL is infinite) and the model KL would need weights pi/q the samples cannot supply: the
KL is then not estimated and the summary says why. Responses cut at max_new_tokens make it
the KL of the first max_new_tokens tokens (the responses as evaluated).

Per sample, with d_t = log q_ckpt(y_t | x, y_<t) - log q_init(y_t | x, y_<t) over its
response tokens (EOS included when generated):

    k1 = sum_t d_t                          E[k1] = KL (the chain rule)
    k3 = sum_t (exp(-d_t) - 1 + d_t)        E[k3] = KL (E[exp(-d_t) | prefix] = 1 per token)

k3 is summed per token, not taken on the sequence (exp(-sum d) - 1 + sum d, also unbiased):
each token's term is >= 0 and its exp(-d_t) is one token's ratio, where the sequence form
multiplies every token's ratio and its variance grows with the length. Both log-probs come
from one teacher-forced forward per model through the same transformers code (the hf
engine's own model for the checkpoint), never the engine's sampled log-probs: vLLM's
kernels and precision differ from a transformers forward, so mixing the two would give a
nonzero KL for a checkpoint equal to its initial model. Cost: two forwards per sample (the
checkpoint's and the initial model's), the initial model loaded once per process.

The initial model is the `model.path` of the run config saved in each checkpoint
(`common.layout.CHECKPOINT_CONFIG`): the model every run of a sweep starts from
(`results/<sweep>/model` for the tiny default). A checkpoint without one (the initial model
itself, a foreign checkpoint) gets no KL.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import yaml

from common.generation.base import Sample, check_same_architecture
from common.generation.hf import prefill_shared
from common.layout import CHECKPOINT_CONFIG

KEYS = ("kl_to_initial_k1", "kl_to_initial_k1_stderr", "kl_to_initial_k3",
        "kl_to_initial_k3_stderr")


# ---------------------------------------------------------------------------------------
# Where the initial model is
# ---------------------------------------------------------------------------------------


def _looks_local(path: str) -> bool:
    """A filesystem path rather than a hub id ("org/name")."""
    return Path(path).is_absolute() or path.startswith(".") or path.count("/") != 1


def saved_run_config(checkpoint: str | Path) -> dict | None:
    """The run config a checkpoint was saved with (`common.layout.CHECKPOINT_CONFIG`, what
    the trainer writes into every checkpoint), None when it has none (a hub model)."""
    path = Path(checkpoint) / CHECKPOINT_CONFIG
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else None


def initial_model_of(checkpoint: str | Path) -> str | None:
    """`model.path` of the run config a checkpoint was saved with (None without one).

    Raises ValueError when that config names a local directory that does not exist: the KL
    needs it, and an evaluation should fail before sampling rather than after."""
    path = Path(checkpoint) / CHECKPOINT_CONFIG
    cfg = saved_run_config(checkpoint)
    if cfg is None:
        return None
    model = str((cfg.get("model") or {}).get("path") or "")
    if not model:
        return None
    if _looks_local(model) and not Path(model).is_dir():
        raise ValueError(f"{path}: model.path={model!r} (the initial model the KL to the "
                         "initial model is measured from) is not a directory; rebuild it "
                         "(snakemake re-runs rule tiny_model) or set kl: false")
    if Path(model).is_dir():
        check_same_architecture(model, checkpoint)
    return model


# ---------------------------------------------------------------------------------------
# Teacher-forced log-probs
# ---------------------------------------------------------------------------------------


def response_logprobs(model, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                      *, temperature: float = 1.0, batch_size: int = 16) -> list[np.ndarray]:
    """log softmax(logits / temperature) of each response token given its prompt and the
    response tokens before it, one float64 array per row (length = len(response)).

    `batch_size` rows go per forward pair: consecutive rows with the same prompt (a
    problem's n samples) share one pass over it (`common.generation.hf.prefill_shared`,
    prompts left-padded), then the responses run on its copied KV cache, right-padded (pad
    positions come after every real token, so under the causal mask they change none). The
    log-softmax runs in float32 or the model's wider dtype (float64 in the exact tests).
    Legend: B rows, U distinct prompts among them, P longest prompt, R longest response.
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature}: the KL needs a sampling distribution "
                         "(temperature > 0)")
    device = next(model.parameters()).device
    out: list[np.ndarray] = []
    with torch.no_grad():
        for start in range(0, len(prompts), batch_size):
            rows_p = [list(p) for p in prompts[start:start + batch_size]]
            rows_r = [list(r) for r in responses[start:start + batch_size]]
            logp = _batch_logprobs(model, rows_p, rows_r, temperature, device)  # (B, R, V)
            for i, r in enumerate(rows_r):
                pos = torch.arange(len(r), device=logp.device)
                tok = torch.tensor(r, dtype=torch.long, device=logp.device)
                out.append(logp[i, pos, tok].double().cpu().numpy())
    return out


def _batch_logprobs(model, rows_p: list[list[int]], rows_r: list[list[int]],
                    temperature: float, device) -> torch.Tensor:
    """(B, R, V) log-probs predicting each row's response tokens: position j predicts
    response token j (j = 0 from the prompt's last position)."""
    distinct: list[list[int]] = []
    prompt_of = []
    for p in rows_p:
        if not distinct or p != distinct[-1]:
            distinct.append(p)
        prompt_of.append(len(distinct) - 1)
    P = max(len(p) for p in distinct)
    ids = torch.zeros(len(distinct), P, dtype=torch.long)  # (U, P); 0 pads, masked
    mask = torch.zeros(len(distinct), P, dtype=torch.long)
    for u, p in enumerate(distinct):
        ids[u, P - len(p):] = torch.tensor(p)
        mask[u, P - len(p):] = 1
    rows = torch.tensor(prompt_of, device=device)  # (B,)
    mask = mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # (U, P)
    first, cache = prefill_shared(model, ids.to(device), mask, positions, rows)
    logits = first.logits[:, -1:][rows]  # (B, 1, V): predicts response token 0
    R = max(len(r) for r in rows_r)
    if R > 1:
        rid = torch.zeros(len(rows_r), R - 1, dtype=torch.long)  # (B, R-1): tokens 0..R-2
        rmask = torch.zeros(len(rows_r), R - 1, dtype=torch.long)
        for i, r in enumerate(rows_r):
            if len(r) > 1:
                rid[i, : len(r) - 1] = torch.tensor(r[:-1], dtype=torch.long)
                rmask[i, : len(r) - 1] = 1
        start = mask.sum(-1)[rows]  # (B,) each row's prompt length: its first response position
        rest = model(input_ids=rid.to(device),
                     attention_mask=torch.cat([mask[rows], rmask.to(device)], dim=-1),
                     position_ids=start[:, None] + torch.arange(R - 1, device=device),
                     past_key_values=cache, use_cache=True).logits  # (B, R-1, V)
        logits = torch.cat([logits, rest], dim=1)
    wide = torch.promote_types(logits.dtype, torch.float32)
    return torch.log_softmax(logits.to(wide) / temperature, dim=-1)


# ---------------------------------------------------------------------------------------
# Estimators
# ---------------------------------------------------------------------------------------


def k1(log_ratio: np.ndarray) -> float:
    """Sequence k1: the summed per-token log-ratio log q_ckpt - log q_init."""
    return float(np.sum(log_ratio, dtype=np.float64))


def k3(log_ratio: np.ndarray) -> float:
    """Per-token k3, summed over the response: sum_t exp(-d_t) - 1 + d_t (each term >= 0)."""
    d = np.asarray(log_ratio, dtype=np.float64)
    return float(np.sum(np.expm1(-d) + d))


def kl_summary(per_problem: Sequence[Sequence[np.ndarray]]) -> dict[str, float]:
    """Mean k1 and k3 over all samples, with standard errors as the accuracy's
    `mean_stderr`: the std of the per-problem means over sqrt(#problems).
    `per_problem[i][j]` is sample j of problem i's per-token log-ratio."""
    out: dict[str, float] = {}
    for name, estimate in (("k1", k1), ("k3", k3)):
        values = np.array([[estimate(d) for d in per] for per in per_problem])  # (P, n)
        means = values.mean(axis=1)  # (P,)
        se = float(means.std(ddof=1) / math.sqrt(means.size)) if means.size > 1 else 0.0
        out[f"kl_to_initial_{name}"] = float(values.mean())
        out[f"kl_to_initial_{name}_stderr"] = se
    return out


# ---------------------------------------------------------------------------------------
# The evaluation's hook
# ---------------------------------------------------------------------------------------


def load_scoring_model(path: str | Path, device: str, dtype: str):
    """A transformers model for teacher-forced scoring, in eval mode on `device`."""
    from transformers import AutoModelForCausalLM

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    kind = dtype if dtype == "auto" else getattr(torch, dtype)
    return AutoModelForCausalLM.from_pretrained(path, dtype=kind).to(device).eval()


@functools.cache
def initial_scoring_model(path: str, device: str, dtype: str):
    """The initial model, loaded once per process: it serves every checkpoint of the job."""
    return load_scoring_model(path, device, dtype)


def skip_reason(temperature: float, top_p: float) -> str | None:
    """Why these sampling settings give no KL estimate (None: they do)."""
    if temperature == 0:
        return "temperature 0 (greedy): no sampling distribution to measure a KL between"
    if top_p < 1:
        return (f"top_p={top_p} < 1: the initial model's nucleus can exclude a sampled token, "
                "and the samples cannot estimate the models' KL")
    return None


def kl_to_initial(ckpt_model, initial: str, prompt_ids: Sequence[Sequence[int]],
                  samples: Sequence[Sequence[Sample]], *, temperature: float, top_p: float,
                  device: str, dtype: str, reference_sha256: str | None,
                  batch_size: int = 16) -> dict:
    """The summary's `kl_to_initial` block for one (checkpoint, benchmark): the estimate and
    what it is of (reference, its weights' sha256, temperature, top_p), or `skipped` with the
    reason. `samples[i]` are problem i's samples, drawn from `ckpt_model`'s weights."""
    block = {"reference": initial, "reference_sha256": reference_sha256,
             "temperature": temperature, "top_p": top_p}
    reason = skip_reason(temperature, top_p)
    if reason is not None:
        return {**block, "skipped": reason}
    rows_p = [prompt_ids[i] for i, per in enumerate(samples) for _ in per]
    rows_r = [s.token_ids for per in samples for s in per]
    init_model = initial_scoring_model(initial, device, dtype)
    ckpt = response_logprobs(ckpt_model, rows_p, rows_r, temperature=temperature,
                             batch_size=batch_size)
    init = response_logprobs(init_model, rows_p, rows_r, temperature=temperature,
                             batch_size=batch_size)
    ratios = [c - i for c, i in zip(ckpt, init)]
    n = len(samples[0])
    per_problem = [ratios[i * n:(i + 1) * n] for i in range(len(samples))]
    return {**block, **kl_summary(per_problem), "num_samples": len(ratios)}
