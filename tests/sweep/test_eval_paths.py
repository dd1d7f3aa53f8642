"""How an evaluation's paths reach `python -m eval`: the stray folder named
`'/tmp/gpu_check_.../eval/step_4'` that was once committed at the repository root came from a
shell-quoted `--out '.../step_{step}'` split without a shell, so the quotes stayed in the
path and the path became relative. Python callers take the argument list; the eval CLI
refuses a quoted path in one line."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sweep.runconfig import eval_args, eval_argv
from sweep.spec import SweepError, load_sweep, merged

REPO = Path(__file__).resolve().parents[2]


def _sweep(tmp_path, results: str):
    data = merged(yaml.safe_load((REPO / "config" / "default.yaml").read_text()),
                  {"results_dir": str(tmp_path / results), "mlflow": {"enabled": False}})
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_sweep(path)


def test_the_argument_list_holds_plain_paths_and_the_shell_string_round_trips(tmp_path):
    sweep = _sweep(tmp_path, "results dir")  # a space: the shell string must quote it
    argv = eval_argv(sweep, "dapo_s0", [10, 20], ["toy"])
    out = argv[argv.index("--out") + 1]
    assert out.endswith("/runs/dapo_s0/eval/step_{step}") and out.startswith("/")
    assert "'" not in out
    # the rule's string is the same list, quoted for a shell (the folder has a space)
    assert shlex.split(eval_args(sweep, "dapo_s0", [10, 20], ["toy"])) == argv
    assert f"--out {shlex.quote(out)}" in eval_args(sweep, "dapo_s0", [10, 20], ["toy"])


def test_a_shell_string_split_without_a_shell_is_refused_before_anything_is_written(tmp_path):
    """The reproduction: the old mistake, `str.split` of the quoted string, with {step}
    filled in. Without the check, eval would write under `./'<...>/step_4'` in its working
    directory."""
    sweep = _sweep(tmp_path, "results")
    wrong = eval_args(sweep, "dapo_s0", [4], ["toy"]).replace("{step}", "4").split()
    out = wrong[wrong.index("--out") + 1]
    assert out.startswith("'") and out.endswith("'")
    proc = subprocess.run([sys.executable, "-m", "eval", *wrong], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert "a shell-quoted path reached the command without a shell" in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: --out '/")
    assert not any(p.name.startswith("'") for p in tmp_path.iterdir())


def test_eval_kl_false_reaches_the_eval_cli_as_no_kl(tmp_path):
    """eval.kl: false (config/real-cpu.yaml: the KL's two forward passes cost a real model on
    CPU more than sampling) becomes --no-kl, which the eval CLI parses into kl=False."""
    from eval.__main__ import eval_parser

    on = eval_argv(_sweep(tmp_path, "on"), "dapo_s0", [10], ["toy"])
    data = merged(yaml.safe_load((REPO / "config" / "default.yaml").read_text()),
                  {"results_dir": str(tmp_path / "off"), "eval": {"kl": False}})
    (tmp_path / "off.yaml").write_text(yaml.safe_dump(data))
    off = eval_argv(load_sweep(tmp_path / "off.yaml"), "dapo_s0", [10], ["toy"])
    assert "--no-kl" not in on and "--no-kl" in off
    assert eval_parser().parse_args(on).kl is True
    assert eval_parser().parse_args(off).kl is False


def test_eval_greedy_reaches_the_eval_cli_and_the_initial_models_evaluation(tmp_path):
    """eval.greedy: true becomes --greedy for every run's evaluation and the initial
    model's (the warm start's greedy row); the default adds nothing."""
    from eval.__main__ import eval_parser
    from sweep.runconfig import initial_eval_args

    off = eval_argv(_sweep(tmp_path, "off"), "dapo_s0", [10], ["toy"])
    data = merged(yaml.safe_load((REPO / "config" / "default.yaml").read_text()),
                  {"results_dir": str(tmp_path / "on"), "eval": {"greedy": True}})
    (tmp_path / "on.yaml").write_text(yaml.safe_dump(data))
    sweep = load_sweep(tmp_path / "on.yaml")
    on = eval_argv(sweep, "dapo_s0", [10], ["toy"])
    assert "--greedy" in on and "--greedy" not in off
    assert eval_parser().parse_args(on).greedy is True
    assert eval_parser().parse_args(off).greedy is False
    assert "--greedy" in initial_eval_args(sweep, ["toy"])


def test_eval_dtype_reaches_the_eval_cli_and_auto_adds_nothing(tmp_path):
    """eval.dtype: float32 becomes --dtype float32 (the engine's dtype in eval.run); the
    default, auto, adds no argument, so existing sweeps keep their commands."""
    from eval.__main__ import eval_parser

    auto = eval_argv(_sweep(tmp_path, "auto"), "dapo_s0", [10], ["toy"])
    data = merged(yaml.safe_load((REPO / "config" / "default.yaml").read_text()),
                  {"results_dir": str(tmp_path / "f32"), "eval": {"dtype": "float32"}})
    (tmp_path / "f32.yaml").write_text(yaml.safe_dump(data))
    f32 = eval_argv(load_sweep(tmp_path / "f32.yaml"), "dapo_s0", [10], ["toy"])
    assert "--dtype" not in auto and f32[f32.index("--dtype") + 1] == "float32"
    assert eval_parser().parse_args(auto).dtype == "auto"
    assert eval_parser().parse_args(f32).dtype == "float32"
    data["eval"]["dtype"] = "fp32"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(SweepError, match="eval.dtype: Input should be 'auto', 'float32'"):
        load_sweep(tmp_path / "bad.yaml")
