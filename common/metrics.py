"""The metric registry: what every logged or evaluated metric means and how to show it.

One entry per metric name, written once here: the trainer's `metrics.jsonl` keys, the keys
of an evaluation summary's scorer block, and the pass_at_<k>/maj_at_<k> families. Tables,
plots and the report read direction (higher is better?), aggregation, display name and
format from here instead of guessing; a test checks that every key the trainer logs has an
entry. This module imports nothing from the project, so a lower layer may import it too.

    from common.metrics import metric_meta
    metric_meta("acc_mean").format(0.59375)   # "59.38"
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from algorithms.registry import Registry

AGGREGATIONS = ("mean", "sum", "max", "last")
FORMATS = ("percent", "float", "int", "seconds")


@dataclass(frozen=True)
class MetricMeta:
    """What a metric means and how to show it.

    higher_is_better: True / False for metrics with a direction (used for bold/underline
        ranking); None for diagnostics without one (entropy, KL, lengths, timings).
    aggregation: how a run's per-step values reduce to one number for a run summary:
        "mean", "sum" (per-step counts and times), "max" (per-step maxima), or "last"
        (cumulative counters, and evaluation metrics whose Last/Best tables reduce them).
        A loss metric (algorithms.LOSS_METRICS) is "mean" or "max", and the trainer reduces
        it the same way over a step's updates (micro-batches, mini-batches, epochs, ranks).
        Across seeds every metric is averaged and given a standard error.
    fmt: "percent" (a fraction shown x100), "float", "int" or "seconds".
    decimals: digits after the point in the displayed value (after the x100 for percent).
    bounds: the range the quantity itself can take, where it is narrower than what `fmt`
        implies (a percent metric is a fraction in [0, 1]); intervals are clipped to it.
    """

    name: str
    display: str
    higher_is_better: bool | None
    aggregation: str
    fmt: str
    decimals: int
    description: str
    bounds: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"{self.name}: aggregation={self.aggregation!r} not in {AGGREGATIONS}")
        if self.fmt not in FORMATS:
            raise ValueError(f"{self.name}: fmt={self.fmt!r} not in {FORMATS}")

    @property
    def scale(self) -> float:
        """Multiplier from the stored value to the displayed one (100 for percent)."""
        return 100.0 if self.fmt == "percent" else 1.0

    @property
    def value_range(self) -> tuple[float, float]:
        """(low, high) the true value lies in: `bounds`, else [0, 1] for a percent metric
        (a fraction), else unbounded. An interval clipped to it keeps its coverage."""
        if self.bounds is not None:
            return self.bounds
        return (0.0, 1.0) if self.fmt == "percent" else (-math.inf, math.inf)

    def format(self, value: float) -> str:
        """The displayed string of one value ("59.38" for 0.59375 as percent); "–" for NaN."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "–"
        return f"{value * self.scale:.{self.decimals}f}"

    def axis_label(self) -> str:
        """A plot axis label with the unit."""
        unit = {"percent": " (%)", "seconds": " (s)"}.get(self.fmt, "")
        return f"{self.display}{unit}"


def _m(name, display, hib, agg, fmt, dec, desc, bounds=None) -> MetricMeta:
    return MetricMeta(name, display, hib, agg, fmt, dec, desc, bounds)


NONNEGATIVE = (0.0, math.inf)  # a KL: its estimate may dip below 0, the KL itself cannot


# Training metrics, in the order the trainer logs them.
_TRAIN_METRICS = [
    _m("step", "Step", None, "last", "int", 0, "optimizer step (1-based)"),
    _m("reward_mean", "Reward", True, "mean", "float", 3, "mean sequence reward of the batch"),
    _m("reward_std", "Reward std", None, "mean", "float", 3, "std of sequence rewards"),
    _m("acc_mean", "Training accuracy", True, "mean", "percent", 2, "fraction of rollouts correct"),
    _m("response_length_mean", "Response length (tokens)", None, "mean", "float", 1, "mean tokens"),
    _m("response_length_max", "Max response length (tokens)", None, "max", "int", 0, "max tokens"),
    _m("truncated_frac", "Truncated", None, "mean", "percent", 2, "fraction hitting max tokens"),
    _m("entropy", "Entropy", None, "mean", "float", 3, "mean token entropy (nats)"),
    _m("kl_ref_k1", "KL(ref) k1", None, "mean", "float", 4, "policy vs reference, k1"),
    _m("kl_ref_k3", "KL(ref) k3", None, "mean", "float", 4, "policy vs reference, k3"),
    _m("kl_behav_k1", "KL(behav) k1", None, "mean", "float", 4, "policy vs behaviour, k1"),
    _m("kl_behav_k3", "KL(behav) k3", None, "mean", "float", 4, "policy vs behaviour, k3"),
    _m("is_weight_mean", "IS weight", None, "mean", "float", 3, "mean importance weight"),
    _m("is_weight_max", "Max IS weight", None, "max", "float", 3, "max importance weight"),
    _m("clip_frac_upper", "Clip frac (upper)", None, "mean", "percent", 2, "upper clip"),
    _m("clip_frac_lower", "Clip frac (lower)", None, "mean", "percent", 2, "lower clip"),
    _m("clip_frac_dual", "Clip frac (dual)", None, "mean", "percent", 2, "dual clip"),
    _m("pg_loss", "PG loss", None, "mean", "float", 4, "policy-gradient part of the loss"),
    _m("kl_loss", "KL loss", None, "mean", "float", 4, "KL part of the loss"),
    _m("loss", "Loss", None, "mean", "float", 4, "total loss"),
    _m("groups_kept", "Groups kept", None, "sum", "int", 0, "dynamic sampling: kept groups"),
    _m("groups_dropped", "Groups dropped", None, "sum", "int", 0, "dynamic sampling: dropped"),
    _m("gen_batches", "Generation batches", None, "sum", "int", 0, "rollout batches per step"),
    _m("grad_norm", "Grad norm", None, "mean", "float", 3, "gradient norm before clipping"),
    _m("lr", "Learning rate", None, "last", "float", 8, "learning rate"),
    _m("time_rollout", "Rollout time", None, "sum", "seconds", 2, "seconds in rollout"),
    _m("time_logprob", "Log-prob time", None, "sum", "seconds", 2, "seconds in log-probs"),
    _m("time_update", "Update time", None, "sum", "seconds", 2, "seconds in updates"),
    _m("time_step", "Step time", None, "sum", "seconds", 2, "seconds per step"),
    _m("tokens_per_sec", "Tokens/s", True, "mean", "float", 1, "training throughput"),
    _m("rollout_weights_step", "Sampler weights' step", None, "last", "int", 0, "the step whose weights sampled this step's rollout and recomputed its pi_old (0: the initial weights)"),
    _m("rollout_staleness", "Rollout staleness", None, "max", "int", 0, "steps the sampler's weights lag those the step trains from (rollout.staleness, as used)"),
    _m("rollout_logprob_gap_mean", "Sampler log-prob gap", False, "mean", "float", 6, "mean |log pi_vllm - log pi_trainer| per sampled token"),
    _m("rollout_logprob_gap_max", "Max sampler log-prob gap", False, "max", "float", 6, "max |log pi_vllm - log pi_trainer| over sampled tokens"),
    _m("correction_ratio_mean", "pi_old/mu ratio", None, "mean", "float", 4, "rollout.correction: mean pi_old/mu per sampled token (1 with the hf engine)"),
    _m("correction_ratio_max", "Max pi_old/mu ratio", None, "max", "float", 4, "rollout.correction: max pi_old/mu over sampled tokens"),
    _m("correction_frac_truncated", "Correction truncated", None, "mean", "percent", 2, "tis modes: fraction of tokens (seq_tis: sequences) whose ratio was capped"),
    _m("correction_frac_masked", "Correction masked", None, "mean", "percent", 2, "mis modes: fraction of tokens (seq_mis: sequences) masked out"),
    _m("correction_ess", "Correction ESS", True, "mean", "float", 4, "normalised effective sample size (sum w)^2 / (n sum w^2) of the correction weights"),
    _m("correction_kl_mu_old", "KL(mu || pi_old)", False, "mean", "float", 6, "sampler vs trainer, k3 of pi_old/mu per token"),
    _m("nonfinite_skips", "Non-finite skips", False, "last", "int", 0,
       "skipped updates so far (the trainer logs a running total)"),
    _m("ref_updates", "Reference updates", None, "last", "int", 0, "reference refreshes so far"),
]

# Keys of one scorer's block in an evaluation summary, plus the per-(checkpoint, benchmark) fields collect() copies onto every scorer row.
_EVAL_METRICS = [
    _m("mean", "Mean@n", True, "last", "percent", 2, "average accuracy over all n samples"),
    _m("mean_stderr", "Mean@n s.e.", None, "last", "percent", 2, "s.e. over problems"),
    _m("mean_ci95_low", "Mean@n CI95 low", None, "last", "percent", 2, "bootstrap 95% low"),
    _m("mean_ci95_high", "Mean@n CI95 high", None, "last", "percent", 2, "bootstrap 95% high"),
    _m("greedy", "Greedy", True, "last", "percent", 2,
       "accuracy of one greedy answer per problem (temperature 0; eval.greedy)"),
    _m("extract_fail_rate", "Extraction failures", False, "last", "percent", 2, "no answer"),
    _m("timeout_rate", "Grader timeouts", False, "last", "percent", 2, "grading timed out"),
    _m("error_rate", "Grader errors", False, "last", "percent", 2, "grading raised an error"),
    _m("truncation_rate", "Truncated", False, "last", "percent", 2, "hit max_new_tokens"),
    _m("n", "Samples per problem", None, "last", "int", 0, "n of Mean@n"),
    _m("num_problems", "Problems", None, "last", "int", 0, "problems in the benchmark"),
    # eval/kl.py: sequence-level KL(pi_ckpt || pi_init) on the evaluation samples, in nats
    _m("kl_to_initial_k1", "KL to initial (k1)", None, "last", "float", 3,
       "sequence KL to the initial model, summed log-ratio", NONNEGATIVE),
    _m("kl_to_initial_k1_stderr", "KL to initial (k1) s.e.", None, "last", "float", 3,
       "s.e. over problems"),
    _m("kl_to_initial_k3", "KL to initial (k3)", None, "last", "float", 3,
       "sequence KL to the initial model, per-token k3 summed", NONNEGATIVE),
    _m("kl_to_initial_k3_stderr", "KL to initial (k3) s.e.", None, "last", "float", 3,
       "s.e. over problems"),
]

_PATTERNS = [
    (re.compile(r"pass_at_(\d+)"), "Pass@{k}", "unbiased pass@k (Chen et al. 2021)"),
    (re.compile(r"maj_at_(\d+)"), "Maj@{k}", "majority vote over k samples"),
]


# name -> MetricMeta of the fixed-name metrics (training, then evaluation)
METRICS: Registry[MetricMeta] = Registry("metric")
for _meta in _TRAIN_METRICS + _EVAL_METRICS:
    METRICS.register(_meta.name, _meta)


def load_metric_meta() -> dict[str, MetricMeta]:
    """The registry of fixed-name metrics (training and evaluation), keyed by name.

    pass_at_<k> and maj_at_<k> are families; look them up with `metric_meta(name)`.
    """
    return dict(METRICS)


def metric_meta(name: str) -> MetricMeta:
    """Metadata of `name`, including pass_at_<k>/maj_at_<k>; KeyError lists what is known."""
    if name in METRICS:
        return METRICS[name]
    for pattern, display, desc in _PATTERNS:
        match = pattern.fullmatch(name)
        if match:
            k = match.group(1)
            return MetricMeta(name, display.format(k=k), True, "last", "percent", 2, desc)
    raise KeyError(
        f"no metadata for metric {name!r}; known: {sorted(METRICS)} and the families "
        "pass_at_<k>, maj_at_<k> (add it to common/metrics.py)"
    )
