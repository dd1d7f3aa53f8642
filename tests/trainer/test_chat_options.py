"""task.chat.enable_thinking reaches the chat template of every rollout prompt and is saved in
the run's config; a template's worked examples are in the rollout prompts too (issue 51)."""

from __future__ import annotations

import yaml

from trainer.config import dump_run_config
from trainer.loop import Trainer

# Qwen3's switch on a ChatML template: false closes an empty think block, unset adds nothing.
THINKING_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% elif enable_thinking is defined and enable_thinking %}<think>\n{% endif %}{% endif %}"
)


def rollout_prompts(cfg) -> list[str]:
    """The prompt strings one rollout step samples from, with THINKING_CHATML on the
    trainer's (real, tiny) tokenizer."""
    trainer = Trainer(cfg)
    trainer.setup(track=False)
    trainer.tokenizer.chat_template = THINKING_CHATML
    seen: list[str] = []
    generate = trainer.engine.generate

    def recording(prompts, **kwargs):
        seen.extend(prompts)
        return generate(prompts, **kwargs)

    trainer.engine.generate = recording
    trainer.collect()
    return seen


def test_thinking_off_reaches_every_rollout_prompt_and_the_saved_config(make_cfg):
    cfg = make_cfg("off", task={"chat": {"enable_thinking": False}, "template": "boxed_1shot"},
                   rollout={"max_new_tokens": 4, "overlong_buffer": 2})
    prompts = rollout_prompts(cfg)
    assert len(prompts) == 4
    assert all(p.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") for p in prompts)
    assert all("<|im_start|>assistant\n23 + 14 = 37. The answer is \\boxed{37}.<|im_end|>"
               in p for p in prompts)  # the worked example, as an earlier turn
    saved = yaml.safe_load(dump_run_config(cfg))
    assert saved["task"]["chat"] == {"enable_thinking": False}


def test_unset_leaves_the_chat_templates_default(make_cfg):
    prompts = rollout_prompts(make_cfg("default", rollout={"max_new_tokens": 4,
                                                            "overlong_buffer": 2}))
    assert prompts and all(p.endswith("<|im_start|>assistant\n") for p in prompts)
    assert make_cfg("d").task.chat.enable_thinking is None
