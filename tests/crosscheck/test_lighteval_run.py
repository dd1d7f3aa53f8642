"""eval/lighteval/run.py's checks, which run before lighteval loads any weights: an absent
lighteval, a bad checkpoint, a benchmark lighteval cannot read, a checkpoint that would
decode greedily. The script runs in lighteval's environment, so it is loaded by path here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from eval.lighteval_convert import export_benchmark

SCRIPT = Path(__file__).resolve().parents[2] / "eval" / "lighteval" / "run.py"
_spec = importlib.util.spec_from_file_location("lighteval_run", SCRIPT)
run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run)


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    """A checkpoint folder as the trainer writes it: no do_sample in its generation config."""
    ckpt = tmp_path / "step_100"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "llama"}')
    (ckpt / "model.safetensors").write_bytes(b"weights")
    (ckpt / "generation_config.json").write_text('{"eos_token_id": 1, "top_k": 50}')
    return ckpt


def test_a_trainer_checkpoint_would_decode_greedily(checkpoint):
    config = json.loads((checkpoint / "generation_config.json").read_text())
    assert "do_sample" in run.greedy_reason(config, n=4)
    assert "identical answers" in run.greedy_reason({"do_sample": True, "temperature": 0}, n=4)
    assert run.greedy_reason({"do_sample": True, "temperature": 0.7}, n=4) is None


def test_view_states_every_sampling_setting(checkpoint, tmp_path):
    view = tmp_path / "view"
    config = run.sampling_view(checkpoint, view, temperature=0.6, top_p=0.95, max_new_tokens=48)
    written = json.loads((view / "generation_config.json").read_text())
    assert written == config
    assert written == {"eos_token_id": 1, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
                       "num_beams": 1, "do_sample": True, "temperature": 0.6, "top_p": 0.95,
                       "max_new_tokens": 48}
    assert run.greedy_reason(written, n=4) is None
    assert (view / "model.safetensors").resolve() == (checkpoint / "model.safetensors").resolve()
    # the checkpoint itself is untouched
    assert "do_sample" not in (checkpoint / "generation_config.json").read_text()


def test_benchmark_lighteval_can_and_cannot_read(tmp_path):
    good = tmp_path / "toy"
    export_benchmark("toy", good / "toy.jsonl", "dapo", limit=5)
    assert run.check_benchmark(good, "toy") == 5
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "toy.jsonl").write_text('{"query": "q", "answer": "1"}\n{"query": \n')
    with pytest.raises(run.SetupError, match="lighteval cannot read .*toy.jsonl with datasets"):
        run.check_benchmark(broken, "toy")
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "toy.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    with pytest.raises(run.SetupError, match=r"lacks columns \['query'\]"):
        run.check_benchmark(raw, "toy")
    with pytest.raises(run.SetupError, match="exactly one .jsonl"):
        run.check_benchmark(tmp_path / "nothing", "toy")


def test_bad_setups_exit_2_with_one_line_before_lighteval_runs(checkpoint, tmp_path, capsys,
                                                                monkeypatch):
    bench = tmp_path / "toy"
    export_benchmark("toy", bench / "toy.jsonl", "dapo", limit=3)
    args = ["--benchmark", "toy", "--benchmark-dir", str(bench), "--out", str(tmp_path / "r.json")]
    monkeypatch.setitem(sys.modules, "lighteval", None)  # as in an environment without it
    assert run.main(["--checkpoint", str(checkpoint), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "lighteval is not importable" in err
    assert "rule lighteval_env" in err
    monkeypatch.setattr(run, "check_lighteval", lambda: "0.13.0")
    assert run.main(["--checkpoint", str(tmp_path / "nope"), *args]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert run.main(["--checkpoint", str(checkpoint), "--temperature", "0", *args]) == 2
    assert "n=32 at temperature 0" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()
