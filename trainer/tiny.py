"""Build the tiny offline policy: a local tokenizer, a small Llama, and a warm start by SFT.

Everything is made here, on the CPU, in well under a minute, and saved in HF format so every
downstream tool (trainer, evaluation, vLLM) loads it like a hub model:

    python -m trainer tiny --out results/default/model            # build + warm start
    python -m trainer tiny --out /tmp/tiny --sft-steps 0           # untrained, for plumbing

The tokenizer is a byte-level BPE trained on the DAPO prompt template and the toy task
text (digits split one per token), so the long DAPO instruction costs ~60 tokens, and it
carries a two-role chat template: `common.prompts.build_prompt(problem, "dapo", tokenizer)`
then yields exactly the prompt that training and evaluation both use.

The warm start is supervised fine-tuning on `common.toy` problems where a fraction
`wrong_fraction` of targets end with the format slip (`toy.wrong_solution`, no answer line):
the resulting policy solves some held-out problems and fails others in a way a verifiable
reward can correct, which is what the RL loop is for.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from pydantic import BaseModel, ConfigDict, Field
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm

from common import toy
from common.prompts import build_prompt, render
from trainer.runtime import tune_cpu_runtime

if TYPE_CHECKING:  # imported where used: the sweep reads TinyConfig without loading a model
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|pad|>", "<|eos|>", "<|user|>", "<|assistant|>"]
# Two roles, one newline after each header; the assistant turn ends with EOS. Kept minimal so
# the prompt stays short in tokens.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}<|eos|>{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class TinyConfig(BaseModel):
    """Sizes and warm-start budget of the tiny policy (defaults: the embedded default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = 0
    vocab_size: int = Field(512, ge=64, description="BPE vocabulary size (incl. special tokens)")
    hidden_size: int = Field(96, ge=8)
    intermediate_size: int = Field(288, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(3, ge=1)
    max_positions: int = Field(
        1024, ge=32, description="longest prompt + response in tokens (vLLM enforces it: an AIME "
        "prompt is ~450 tiny-tokenizer tokens)")
    sft_steps: int = Field(600, ge=0, description="warm-start optimizer steps (0: random init)")
    sft_batch_size: int = Field(32, ge=1)
    sft_lr: float = Field(3e-3, gt=0)
    wrong_fraction: float = Field(
        0.5, ge=0.0, le=1.0, description="share of SFT targets ending with the format slip"
    )


# ---------------------------------------------------------------------------- tokenizer


def build_tokenizer(cfg: TinyConfig) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on the template and task text; digits stay single tokens."""
    from transformers import PreTrainedTokenizerFast

    corpus = []
    for p in toy.problems("train", 400, seed=cfg.seed) + toy.problems("test", 100, seed=cfg.seed):
        for template in ("dapo", "boxed"):
            corpus.append(render(p["problem"], template))
        corpus += [toy.solution(p["problem"]), toy.wrong_solution(p["problem"])]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|eos|>", pad_token="<|pad|>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"  # generation pads on the left; training code pads explicitly
    return fast


# ---------------------------------------------------------------------------- model


def build_model(cfg: TinyConfig, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """A randomly initialised small Llama sized to `tokenizer` (seeded by `cfg.seed`)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_positions, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, rope_theta=10000.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


# ---------------------------------------------------------------------------- warm start


def sft_examples(cfg: TinyConfig, tokenizer, n: int) -> list[tuple[list[int], list[int]]]:
    """`n` (prompt_ids, response_ids+EOS) pairs; `wrong_fraction` use the mistaken solution."""
    rng = random.Random(f"tiny-sft-{cfg.seed}")
    out = []
    for p in toy.problems("train", n, seed=cfg.seed):
        prompt = build_prompt(p["problem"], "dapo", tokenizer)
        wrong = rng.random() < cfg.wrong_fraction
        response = (toy.wrong_solution if wrong else toy.solution)(p["problem"])
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
        out.append((prompt_ids, response_ids + [tokenizer.eos_token_id]))
    return out


def _collate(batch, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input_ids, attention_mask and labels (-100 off the response), all (B, L)."""
    length = max(len(p) + len(r) for p, r in batch)
    ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), length), -100, dtype=torch.long)
    attn = torch.zeros((len(batch), length), dtype=torch.long)
    for i, (p, r) in enumerate(batch):
        seq = p + r
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        labels[i, len(p) : len(seq)] = torch.tensor(r)
    return ids, attn, labels


def warm_start(model, tokenizer, cfg: TinyConfig, *, progress: bool = True) -> list[float]:
    """Supervised fine-tuning in place; returns the loss per step. Cosine LR, AdamW."""
    if cfg.sft_steps == 0:
        return []
    examples = sft_examples(cfg, tokenizer, cfg.sft_steps * cfg.sft_batch_size)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.0)
    warmup = max(1, cfg.sft_steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        frac = (step - warmup) / max(1, cfg.sft_steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    losses = []
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        bar = tqdm(range(cfg.sft_steps), desc="warm start (SFT)", disable=not progress)
        for step in bar:
            batch = examples[step * cfg.sft_batch_size : (step + 1) * cfg.sft_batch_size]
            ids, attn, labels = _collate(batch, tokenizer.pad_token_id)
            loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())  # CPU-only path: .item() is cheap here
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    model.eval()
    return losses


def build_tiny(out: str | Path, cfg: TinyConfig | None = None, *, progress: bool = True) -> Path:
    """Tokenizer + model + warm start, saved to `out` (safetensors, tokenizer alongside)."""
    cfg = cfg or TinyConfig()
    out = Path(out)
    tune_cpu_runtime()
    t0 = time.perf_counter()
    tokenizer = build_tokenizer(cfg)
    model = build_model(cfg, tokenizer)
    # One intra-op thread: CPU float reductions depend on the thread count, and Snakemake
    # jobs run single-threaded, so this makes the model identical wherever it is built.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        losses = warm_start(model, tokenizer, cfg, progress=progress)
    finally:
        torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "tiny_config.json").write_text(cfg.model_dump_json(indent=2) + "\n")
    if progress:
        n_params = sum(p.numel() for p in model.parameters())
        last = f"{losses[-1]:.3f}" if losses else "n/a"
        print(f"tiny model: {n_params:,} parameters, vocab {len(tokenizer)}, SFT loss {last}, "
              f"{time.perf_counter() - t0:.1f}s -> {out}")
    return out
