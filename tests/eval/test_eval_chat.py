"""The thinking switch (task.chat.enable_thinking) reaches the evaluation's chat template:
read from the checkpoint's run config like its template, recorded in the summary, and given
by the sweep to the initial model's evaluation, which has no run config; an evaluation set
that holds a template's worked example is refused (issue 51)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from transformers import AutoTokenizer

from eval.run import EvalConfig, engine_options, execute, prepare, trained_thinking

# Qwen3's switch on a ChatML template (tests/common/test_prompts.py has the same idea): false
# closes an empty think block, true opens one, unset adds nothing.
THINKING_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% elif enable_thinking is defined and enable_thinking %}<think>\n{% endif %}{% endif %}"
)


def test_evaluation_takes_the_switch_the_run_trained_with(tmp_path):
    ckpt = tmp_path / "step_2"
    ckpt.mkdir()
    assert trained_thinking(ckpt, None) is None and trained_thinking(ckpt, True) is True
    (ckpt / "run_config.yaml").write_text(yaml.safe_dump(
        {"task": {"template": "dapo", "chat": {"enable_thinking": False}}}))
    assert trained_thinking(ckpt, None) is False
    with pytest.raises(ValueError, match=r"--enable-thinking true: .*step_2 was trained with "
                       r"task.chat.enable_thinking=False"):
        trained_thinking(ckpt, True)


@pytest.fixture
def thinking_checkpoint(tiny_checkpoint, tmp_path):
    """The tiny eval checkpoint with THINKING_CHATML, saved by a run that turned thinking off."""
    ckpt = tmp_path / "step_3"
    shutil.copytree(tiny_checkpoint, ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    tok.chat_template = THINKING_CHATML
    tok.save_pretrained(ckpt)
    (ckpt / "run_config.yaml").write_text(yaml.safe_dump(
        {"task": {"template": "dapo", "chat": {"enable_thinking": False}}}))
    return ckpt


def test_the_saved_switch_reaches_the_prompts_and_the_summary(thinking_checkpoint, tmp_path,
                                                              benchmark_dir):
    from common.generation import start_engine

    cfg = EvalConfig(checkpoint=str(thinking_checkpoint), benchmark="aime24",
                     benchmark_file=str(benchmark_dir / "aime24.jsonl"), out=str(tmp_path / "o"),
                     n=1, max_new_tokens=2, limit=2, kl=False, progress=False)
    prep = prepare(cfg)
    engine = start_engine("hf", prep.checkpoint, engine_options(prep.cfg))
    seen = []
    generate = engine.generate

    def recording(prompts, **kwargs):
        seen.extend(prompts)
        return generate(prompts, **kwargs)

    engine.generate = recording
    execute(prep, engine)
    assert len(seen) == 2
    assert all(p.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") for p in seen)
    summary = json.loads((tmp_path / "o" / "aime24.json").read_text())
    assert summary["sampling"]["enable_thinking"] is False


def test_the_sweep_passes_the_switch_to_every_evaluation():
    """The initial model's folder holds no run config: the sweep's eval arguments carry the
    base's switch, and none when it is unset (the chat template's default)."""
    from sweep.runconfig import initial_eval_args
    from sweep.spec import parse_sweep

    def args(chat: dict | None) -> str:
        task = {"kind": "toy"} if chat is None else {"kind": "toy", "chat": chat}
        sweep = parse_sweep({"name": "t", "base": {"task": task}, "methods": ["DAPO"],
                             "eval": {"steps": [1], "benchmarks": ["toy"]}})
        return initial_eval_args(sweep, ["toy"])

    assert "--enable-thinking false" in args({"enable_thinking": False})
    assert "--enable-thinking true" in args({"enable_thinking": True})
    assert "--enable-thinking" not in args(None) and "--enable-thinking" not in args({})


def test_an_evaluation_holding_a_worked_example_is_refused_before_sampling(tiny_checkpoint,
                                                                          tmp_path):
    bench = tmp_path / "mine.jsonl"
    bench.write_text("".join(json.dumps({"problem": q, "answer": a}) + "\n" for q, a in
                             [("What is 40 + 2?", "42"), ("What is 23 + 14?", "37")]))
    cfg = EvalConfig(checkpoint=str(tiny_checkpoint), benchmark="arithmetic",
                     benchmark_file=str(bench), out=str(tmp_path / "o"), template="boxed_1shot",
                     kl=False, progress=False)
    with pytest.raises(ValueError, match=r"worked example\(s\) \['What is 23 \+ 14\?'\], "
                       r"which benchmark arithmetic \(.*mine.jsonl\) evaluates"):
        prepare(cfg)
    prepare(cfg.model_copy(update={"template": "boxed"}))  # no example shown: accepted
