"""Expand a sweep into cells (method x axis values x seed), each with a stable run id.

Rules (documented in config/README.md):
  1. Cells are `methods x product(axes) x seeds`, in the order written in the config.
  2. An axis that does not apply to a method is collapsed for that method, with a note:
     divergence / form / ratio_level apply to RPG methods only; estimator / kl_placement /
     kl_importance_weight to penalty methods (objective ppo or reinforce) with a KL term;
     beta and reference to methods with a KL term; clip, entropy_coef and the rollout
     settings correction (`rollout.correction.mode`) and staleness (`rollout.staleness`)
     to every method.
  3. An applicable combination that `LossConfig` rejects is dropped with its reason; a value
     that is invalid on its own (e.g. beta < 0) is an error.
  4. Two cells with the same resolved settings are one cell (the first name wins).
  5. A sweep left with no cell is an error. All of this happens before any job starts.
Run ids are readable and stable: the same cell always maps to the same id, e.g.
`rpg-reinforce-urkl_beta1e-3_s0`, so re-running a sweep resumes, never duplicates.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import TypeAdapter, ValidationError

from algorithms import Method, get_method
from algorithms.config import LossConfig
from trainer.config import MethodConfig, resolve_method

from .spec import Axes, ReferenceAxis, SweepConfig, SweepError, merged

RPG_ONLY = ("divergence", "form", "ratio_level")
PENALTY_ONLY = ("estimator", "kl_placement", "kl_importance_weight")
NEEDS_KL = ("beta", "reference")
LOSS_AXES = RPG_ONLY + PENALTY_ONLY + ("clip", "beta", "entropy_coef")
# Axes that set a run-config `rollout` key, not the method: axis -> its key path in `rollout`
ROLLOUT_AXES = {"correction": ("correction", "mode"), "staleness": ("staleness",)}
MODEL_AXES = ("lora",)  # set the run config's `model` (and with lora.lr, `optim.lr`)
# set outside the loss: part of a cell's identity
RUN_AXES = ("reference", *ROLLOUT_AXES, *MODEL_AXES)


@dataclass(frozen=True)
class Cell:
    """One grid cell and seed: what one training job runs."""

    run_id: str
    label: str
    seed: int
    method: Method  # the named method with the cell's overrides applied
    base_method: str  # the method's name (RPG methods renamed after divergence/form axes)
    axes: dict = field(default_factory=dict)  # applied axis name -> value (JSON-able)

    @property
    def tags(self) -> dict[str, str]:
        """Every axis value as a string, for MLflow filtering and the report."""
        loss = self.method.loss
        clip = loss.clip
        return {
            "method": self.base_method, "label": self.label, "seed": str(self.seed),
            "objective": loss.objective, "divergence": str(loss.divergence),
            "form": str(loss.form), "estimator": str(loss.estimator),
            "kl_placement": str(loss.kl_placement),
            "kl_importance_weight": loss.kl_importance_weight, "ratio_level": loss.ratio_level,
            "clip_eps_low": str(clip.eps_low if clip else None),
            "clip_eps_high": str(clip.eps_high if clip else None),
            "clip_dual_c": str(clip.dual_c if clip else None), "beta": _num(loss.beta),
            "agg": loss.agg, "advantage": self.method.advantage,
            "reference": self.method.reference,
            **{a: str(self.axes[a]) for a in ROLLOUT_AXES if a in self.axes},
            **{a: _axis_token(a, self.axes[a]) for a in MODEL_AXES if a in self.axes},
        }


def _num(v: float) -> str:
    """Compact, stable number: 1e-4 -> '1e-4', 0.28 -> '0.28', 3.0 -> '3'."""
    if v == 0:
        return "0"
    if abs(v) < 1e-2:
        mantissa, exp = f"{v:e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exp)}"
    return f"{v:g}"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9-]", "", name.lower().replace("++", "pp").replace(".", ""))


def _axis_token(axis: str, value) -> str:
    if axis == "form":
        return {"differentiable": "diff", "reinforce": "rf"}[value]
    if axis == "ratio_level":
        return {"token": "tok", "sequence": "seq"}[value]
    if axis == "estimator":  # "k3+": a run id is matched as a regex (workflow wildcards)
        return value.replace("+", "plus")
    if axis == "kl_placement":
        return f"in{value}"
    if axis == "kl_importance_weight":
        return {"none": "iwnone", "detached": "iwsg", "differentiable": "iwdiff",
                "score": "iwscore"}[value]
    if axis == "clip":
        if value is None:
            return "noclip"
        c = "nodual" if value["dual_c"] is None else _num(value["dual_c"])
        return f"clip{_num(value['eps_low'])}-{_num(value['eps_high'])}-{c}"
    if axis == "beta":
        return f"beta{_num(value)}"
    if axis == "entropy_coef":
        return f"ent{_num(value)}"
    if axis == "correction":
        return f"corr-{value.replace('_', '')}"
    if axis == "staleness":
        return f"stale{value}"
    if axis == "lora":
        if value is None:
            return "full"
        alpha = f"-a{_num(value['alpha'])}" if value.get("alpha") is not None else ""
        lr = f"-lr{_num(value['lr'])}" if value.get("lr") is not None else ""
        return f"lora-r{value['rank']}{alpha}{lr}"
    if axis == "reference":
        extra = {"every_k": f"{value.get('k')}", "kl_target": f"{_num(value.get('kappa') or 0)}"}
        return f"ref-{value['schedule'].replace('_', '')}{extra.get(value['schedule'], '')}"
    return str(value)


def _applies(axis: str, method: Method) -> bool:
    loss = method.loss
    has_kl = loss.kl_placement != "none"
    if axis in RPG_ONLY:
        return loss.objective == "rpg"
    if axis in PENALTY_ONLY:
        return loss.objective != "rpg" and has_kl
    if axis in NEEDS_KL:
        return has_kl
    return True


def _jsonable(axes: Axes) -> dict[str, list]:
    out = {}
    for name, values in axes.given().items():
        out[name] = [v.model_dump() if hasattr(v, "model_dump") else v for v in values]
    return out


def _display_name(name: str, resolved: Method, combo: dict) -> str:
    """An RPG method whose divergence/form the grid changed is named for what it now is."""
    loss = resolved.loss
    if loss.objective != "rpg" or not ({"divergence", "form"} & combo.keys()):
        return name
    return f"RPG{'-REINFORCE' if loss.form == 'reinforce' else ''}-{loss.divergence.upper()}"


def _method_overrides(name: str, combo: dict) -> dict:
    """The run config's `method` section that makes `name` the cell `combo`."""
    loss = {k: v for k, v in combo.items() if k in LOSS_AXES}
    spec: dict = {"name": name, **({"loss": loss} if loss else {})}
    if "reference" in combo:
        spec["reference"] = {"schedule": combo["reference"]["schedule"]}
    return spec


def _resolve(name: str, combo: dict, sweep: SweepConfig, source: str) -> Method:
    """The cell's method, resolved once by the trainer's own `resolve_method` with the
    sweep's `base` (its method overrides and rollout DAPO switches) under the cell's axes;
    written into the run config as `method.resolved`. A combination the method rejects
    raises ValidationError (rule 3 drops it); a bad `base.method` key is a SweepError."""
    try:
        spec = MethodConfig.model_validate(merged(sweep.base.get("method") or {},
                                                  _method_overrides(name, combo)))
    except ValidationError as exc:
        reason = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise SweepError(f"{source}: base.method: {reason}") from None
    rollout = sweep.base.get("rollout") or {}
    return resolve_method(spec, rollout.get("dynamic_sampling"), rollout.get("overlong_shaping"))


def method_spec(cell: Cell) -> dict:
    """How the run config names the cell's method: its registered name, the loss axes that
    name does not spell (divergence and form it does) and the reference schedule."""
    loss = {k: v for k, v in cell.axes.items()
            if k in LOSS_AXES and k not in ("divergence", "form")}
    return {"name": cell.base_method, **({"loss": loss} if loss else {}),
            "reference": {"schedule": cell.method.reference, **(reference_settings(cell) or {})}}


def _check_values(axes: dict[str, list], source: str) -> None:
    """Each loss-axis value must be valid on its own (LossConfig's field constraints, e.g.
    beta >= 0): a bad value is an error, not a dropped cell. Rule 3 drops only combinations."""
    for name, values in axes.items():
        if name not in LossConfig.model_fields:
            continue
        field_info = LossConfig.model_fields[name]
        kind = field_info.annotation
        if field_info.metadata:  # the field's own constraints, e.g. Ge(0) on beta
            kind = Annotated[(kind, *field_info.metadata)]
        adapter = TypeAdapter(kind)
        for i, value in enumerate(values):
            try:
                adapter.validate_python(value)
            except ValidationError as exc:
                reason = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
                raise SweepError(f"{source}: axes.{name}[{i}]={value!r} is not a valid value "
                                 f"({reason}); fix or remove it") from None


def expand(sweep: SweepConfig, source: str = "<config>") -> tuple[list[Cell], list[str]]:
    """All cells of `sweep` and the notes explaining collapsed axes and dropped cells."""
    axes = _jsonable(sweep.axes)
    _check_values(axes, source)
    notes: list[str] = []
    cells: list[Cell] = []
    seen: dict[tuple, str] = {}
    for name in sweep.methods:
        try:
            method = get_method(name)
        except ValueError as exc:
            raise SweepError(f"{source}: methods: {exc}") from None
        applicable = {a: v for a, v in axes.items() if _applies(a, method)}
        for a in (a for a in axes if a not in applicable):
            notes.append(f"{name}: axis '{a}' does not apply to this method; collapsed")
        names = list(applicable)
        for values in itertools.product(*(applicable[a] for a in names)):
            combo = dict(zip(names, values))
            try:
                resolved = _resolve(name, combo, sweep, source)
            except ValidationError as exc:
                reason = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
                notes.append(f"{name} {combo}: dropped ({reason})")
                continue
            key = (resolved.model_dump_json(exclude={"name", "source"}),
                   *(str(combo.get(a)) for a in RUN_AXES))
            if key in seen:
                notes.append(f"{name} {combo}: same settings as {seen[key]}; kept once")
                continue
            display = _display_name(name, resolved, combo)
            resolved = resolved.model_copy(update={"name": display})
            # divergence and form are spelled by the display name already
            tokens = [_axis_token(a, combo[a]) for a in names if a not in ("divergence", "form")]
            cell_name = "_".join([_slug(display), *tokens])
            seen[key] = cell_name
            label = display if not tokens else f"{display} [{' '.join(tokens)}]"
            for seed in sweep.seeds:
                cells.append(Cell(run_id=f"{cell_name}_s{seed}", label=label, seed=seed,
                                  method=resolved, base_method=display, axes=combo))
    if not cells:
        raise SweepError(f"{source}: the grid has no valid cell:\n  " + "\n  ".join(notes))
    return cells, notes


def rollout_settings(cell: Cell) -> dict:
    """The run config's `rollout` keys the cell's axes set (correction mode, staleness)."""
    out: dict = {}
    for axis, path in ROLLOUT_AXES.items():
        if axis in cell.axes:
            node = out
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = cell.axes[axis]
    return out


def model_settings(cell: Cell) -> tuple[dict, dict]:
    """The run config's (`model`, `optim`) keys the cell's axes set: model.lora (null: full
    fine-tuning) and, when the lora axis value names one, optim.lr."""
    if "lora" not in cell.axes:
        return {}, {}
    value = cell.axes["lora"]
    if value is None:
        return {"lora": None}, {}
    settings = {k: v for k, v in value.items() if k in ("rank", "alpha") and v is not None}
    return {"lora": settings}, ({"lr": value["lr"]} if value.get("lr") is not None else {})


def reference_settings(cell: Cell) -> dict | None:
    """The cell's reference-schedule axis value (k / kappa), if the grid set one."""
    ref = cell.axes.get("reference")
    return None if ref is None else ReferenceAxis.model_validate(ref).model_dump(exclude_none=True)
