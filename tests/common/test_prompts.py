"""Templates: worked examples as earlier chat turns (inline without a chat template), never an
evaluated question; the thinking switch reaches the chat template (issue 51)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from common.grading import SCORERS
from common.prompts import (
    TEMPLATES,
    build_prompt,
    check_examples_unseen,
    example_questions,
    render,
)
from eval.benchmarks import BENCHMARKS, load_benchmark

ROOT = Path(__file__).resolve().parents[2]
# A ChatML template with Qwen3's switch, written for these tests: unset, the model thinks
# on its own (nothing added); false closes an empty think block (Qwen3's way of turning it
# off); true opens one (so the three settings give three different prompts).
THINKING_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% elif enable_thinking is defined and enable_thinking %}<think>\n{% endif %}{% endif %}"
)
QUESTION = "What is 31 - 17?"


@pytest.fixture
def tokenizer():
    """A real tokenizer object (the shipped tiny model's) carrying THINKING_CHATML."""
    tok = AutoTokenizer.from_pretrained(ROOT / "data" / "tiny-model")
    tok.chat_template = THINKING_CHATML
    return tok


def test_the_worked_example_is_an_earlier_user_and_assistant_turn(tokenizer):
    user = f"{QUESTION}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    example = user.replace(QUESTION, "What is 23 + 14?")
    expected = (f"<|im_start|>user\n{example}<|im_end|>\n"
                "<|im_start|>assistant\n23 + 14 = 37. The answer is \\boxed{37}.<|im_end|>\n"
                f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
    assert build_prompt(QUESTION, "boxed_1shot", tokenizer) == expected
    # the plain template is the same question without the example turns
    assert build_prompt(QUESTION, "boxed", tokenizer) == expected[expected.index(
        "<|im_start|>user\n" + QUESTION):]


def test_without_a_chat_template_the_example_is_inline():
    tok = AutoTokenizer.from_pretrained(ROOT / "data" / "tiny-model")
    tok.chat_template = None
    text = build_prompt(QUESTION, "boxed_1shot", tok)
    assert text == (render("What is 23 + 14?", "boxed") + "\n\n23 + 14 = 37. The answer is "
                    "\\boxed{37}.\n\n" + render(QUESTION, "boxed"))
    assert build_prompt(QUESTION, "boxed", tok) == render(QUESTION, "boxed")


@pytest.mark.parametrize(("thinking", "opening"), [
    (None, ""), (True, "<think>\n"), (False, "<think>\n\n</think>\n\n")])
def test_the_thinking_switch_reaches_the_chat_template(tokenizer, thinking, opening):
    prompt = build_prompt(QUESTION, "dapo", tokenizer, enable_thinking=thinking)
    assert prompt.endswith("<|im_start|>assistant\n" + opening)


def test_every_template_names_a_strict_scorer():
    """The scorer a sweep is told to train on (sweep.checks) must itself be strict."""
    for name, template in TEMPLATES.items():
        assert SCORERS.get(template.scorer).strict, name


def _shipped_evaluation_questions() -> dict[str, set[str]]:
    """Every benchmark's questions this repository holds: a generated task's held-out
    split, a hub benchmark's bundled copy under data/benchmarks/."""
    sets = {}
    for name, hub in BENCHMARKS.items():
        path = None if hub is None else ROOT / "data" / "benchmarks" / f"{name}.jsonl"
        if path is None or path.is_file():
            sets[name] = {p["problem"].strip() for p in load_benchmark(name, path).problems}
    return sets


def test_no_worked_example_is_an_evaluated_question():
    shipped = _shipped_evaluation_questions()
    assert {"arithmetic", "aime24", "amc23"} <= set(shipped)
    examples = example_questions()
    assert examples  # boxed_1shot has one
    assert {name: examples & questions for name, questions in shipped.items()
            if examples & questions} == {}


def test_an_evaluation_that_holds_an_example_is_refused():
    with pytest.raises(ValueError, match=r"template 'boxed_1shot' shows worked example\(s\) "
                       r"\['What is 23 \+ 14\?'\], which my.jsonl evaluates"):
        check_examples_unseen("boxed_1shot", ["What is 1 + 1?", " What is 23 + 14? "],
                              "my.jsonl")
    check_examples_unseen("boxed", ["What is 23 + 14?"], "my.jsonl")  # no examples: nothing shown
