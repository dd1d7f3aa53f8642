"""A throwaway tiny causal LM + tokenizer for the eval tests (built locally, no downloads).

A byte-level BPE tokenizer is trained on the benchmark problems and prompt templates, and a
random-init 2-layer Llama is saved next to it with `save_pretrained`, so the directory is a
real HF checkpoint that `AutoModelForCausalLM` / `AutoTokenizer` (and lighteval) can load.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from common.prompts import TEMPLATES

BENCHMARK_DIR = Path(__file__).resolve().parents[2] / "data" / "benchmarks"
SPECIALS = ["<pad>", "<s>", "</s>"]
# A minimal chat template, so the chat-formatting path of build_prompt is exercised.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _corpus() -> list[str]:
    texts = [t.text for t in TEMPLATES.values()]
    for path in sorted(BENCHMARK_DIR.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            texts += [row["problem"], f"Answer: {row['answer']}", f"\\boxed{{{row['answer']}}}"]
    return texts


def build_tiny_checkpoint(out: Path, *, chat_template: bool = True, seed: int = 0) -> Path:
    """Save a tiny Llama + tokenizer under `out` and return it."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    if chat_template:
        hf_tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(hf_tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    hf_tok.save_pretrained(out)
    return out


if __name__ == "__main__":
    import sys

    print(build_tiny_checkpoint(Path(sys.argv[1])))
