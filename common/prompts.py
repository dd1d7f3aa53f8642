"""Prompt templates shared by evaluation and training, and the one rule for tokenizing a
prompt (`adds_special_tokens`), which every engine and the trainer's packing use.

`dapo` is the DAPO-Math-17k prompt the RPG paper trains and evaluates with (answer on a
last line "Answer: ..."); `boxed` is the common "\\boxed{}" style used by other labs;
`boxed_1shot` is `boxed` after one worked example. A template is applied through the
tokenizer's chat template when the tokenizer has one, raw otherwise, so the same text
reaches hub models and the tiny local model.

Worked examples are earlier user/assistant turns, each user turn the template applied to
the example's question: a small instruct model follows an answer it has seen itself give
(SmolLM2-135M boxed 96% of its answers after one such turn, 29% with the same example
written inside the user message; issue 51). A tokenizer without a chat template gets them
inline, before the question. An example's question must never be an evaluated one
(`check_examples_unseen`, called by every evaluation).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from algorithms.registry import Registry


@dataclass(frozen=True)
class Template:
    """A user message with a `{problem}` slot, its worked examples and the strict scorer
    that reads its answer where it asks for it (the reward to train on)."""

    text: str
    scorer: str  # a strict name in common.grading.SCORERS (tests/common/test_prompts.py)
    examples: tuple[tuple[str, str], ...] = ()  # (question, the assistant's whole answer)


_BOXED = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
TEMPLATES: Registry[Template] = Registry("template")
TEMPLATES.register("dapo", Template((
    "Solve the following math problem step by step. The last line of your response "
    "should be of the form Answer: $Answer (without quotes) where $Answer is the answer "
    "to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
), scorer="dapo"))
TEMPLATES.register("boxed", Template(_BOXED, scorer="math_verify_boxed"))
# One worked example, in common.arithmetic's question form; the question is of its training
# split, never of a held-out one (tests/common/test_prompts.py checks every shipped set).
TEMPLATES.register("boxed_1shot", Template(_BOXED, scorer="math_verify_boxed", examples=(
    ("What is 23 + 14?", "23 + 14 = 37. The answer is \\boxed{37}."),
)))


def render(problem: str, template: str) -> str:
    """The user message for `problem` under `template` (no chat formatting, no examples)."""
    return TEMPLATES.get(template).text.format(problem=problem)


def messages(problem: str, template: str) -> list[dict]:
    """The chat turns: each worked example as a user turn and the assistant's answer, then
    the question."""
    turns = []
    for question, answer in TEMPLATES.get(template).examples:
        turns += [{"role": "user", "content": render(question, template)},
                  {"role": "assistant", "content": answer}]
    return turns + [{"role": "user", "content": render(problem, template)}]


def build_prompt(problem: str, template: str, tokenizer=None,
                 enable_thinking: bool | None = None) -> str:
    """The full prompt string: chat-formatted when `tokenizer` has a chat template (examples
    as earlier turns), else the turns' texts one after the other.

    `enable_thinking` (task.chat.enable_thinking): None leaves the chat template's default
    (Qwen3's thinks); a bool is passed to the chat template, which reads it as a variable
    (a template that does not name it ignores it)."""
    turns = messages(problem, template)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True,
                                             **extra)
    return "\n\n".join(t["content"] for t in turns)


def example_questions(templates: Iterable[str] | None = None) -> set[str]:
    """Every worked example's question, of `templates` (default: all)."""
    names = TEMPLATES if templates is None else templates
    return {q for name in names for q, _ in TEMPLATES.get(name).examples}


def check_examples_unseen(template: str, problems: Iterable[str], where: str) -> None:
    """ValueError when one of `template`'s worked examples is a question of `problems` (an
    evaluation set, `where`): the model would be shown the answer it is scored on."""
    seen = sorted(example_questions([template]) & {p.strip() for p in problems})
    if seen:
        raise ValueError(f"template {template!r} shows worked example(s) {seen}, which "
                         f"{where} evaluates; pick an example outside every evaluation set")


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
