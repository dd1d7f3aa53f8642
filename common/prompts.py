"""Prompt templates shared by evaluation and training, and the one rule for tokenizing a
prompt (`adds_special_tokens`), which every engine and the trainer's packing use.

`dapo` is the DAPO-Math-17k prompt the RPG paper trains and evaluates with (answer on a
last line "Answer: ..."); `boxed` is the common "\\boxed{}" style used by other labs.
A template is applied through the tokenizer's chat template when the tokenizer has one,
raw otherwise, so the same text reaches hub models and the tiny local model.
"""

from __future__ import annotations

from algorithms.registry import Registry

TEMPLATES: Registry[str] = Registry("template")
TEMPLATES.register("dapo", (
    "Solve the following math problem step by step. The last line of your response "
    "should be of the form Answer: $Answer (without quotes) where $Answer is the answer "
    "to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
))
TEMPLATES.register(
    "boxed", "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}.")


def render(problem: str, template: str) -> str:
    """The user message for `problem` under `template` (no chat formatting)."""
    return TEMPLATES.get(template).format(problem=problem)


def build_prompt(problem: str, template: str, tokenizer=None) -> str:
    """The full prompt string: chat-formatted when `tokenizer` has a chat template."""
    message = render(problem, template)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
    return message


def adds_special_tokens(tokenizer) -> bool:
    """Whether tokenizing a prompt adds the tokenizer's special tokens (BOS, ...).

    Not when the tokenizer has a chat template: `build_prompt` then returned chat-formatted
    text that already carries them, and a second BOS would shift every engine's and the
    trainer's view of the prompt. Otherwise the tokenizer's default.
    """
    return not getattr(tokenizer, "chat_template", None)


def encode_prompts(tokenizer, prompts: list[str]) -> list[list[int]]:
    """Token ids of each prompt (no padding), under `adds_special_tokens`."""
    add = adds_special_tokens(tokenizer)
    return [tokenizer(p, add_special_tokens=add)["input_ids"] for p in prompts]
