"""What a step trains with: optimizer, learning-rate schedule, gradient clipping, seed, steps (pure Python).

Two spellings, one meaning each:

* **MindFormers' sections** (a MindFormers user's YAML as it is): ``optimizer: {type: AdamW|Adam|SGD, ...}``,
  ``lr_schedule: {type: CosineWithWarmUpLR, learning_rate, warmup_ratio, total_steps: -1, ...}``,
  ``runner_wrapper: {use_clip_grad, max_grad_norm}``, the top-level ``seed``. The ranks build the optimizer
  and schedule with MindFormers' own ``build_optim`` / ``build_lr`` and its weight-decay grouping (no decay
  for 1-D parameters and biases), as MindFormers' trainer does; ``total_steps: -1`` is the run's steps.
* **the** ``train:`` **section** of recipes without MindFormers sections: ``optimizer: adam|sgd`` and a
  constant ``lr``.

A MindFormers training recipe (:func:`mindformers_training`: a MindFormers config whose ``train:`` section
gives no ``optimizer`` / ``lr``) fills what it leaves out as MindFormers 1.9.0's config template
(``mindformers/tools/register/template.py``) and trainer do: seed 1, ``AdamW`` (betas 0.9/0.999, eps 1e-8,
no weight decay), ``CosineWithWarmUpLR`` from 5e-5 to 0 (the template's ``lr_schedule`` replaces
``optimizer.learning_rate``), clipping at norm 1.0, and the loss as the mean of the micro-batch means
(``calculate_per_token_loss: false``; ``true`` is the mean over the step's answer tokens). The project's
own ``train:`` recipes keep their defaults (seed 0, Adam at 0.01, no clipping, the token mean).

Giving a setting in both places is refused (``give it in one place``), and so is every field MindFormers'
class would not take (its learning-rate classes swallow unknown keyword arguments silently). The field
lists are MindFormers 1.9.0's / MindSpore 2.9.0's signatures (``tests/unit/test_recipe_schema.py`` checks them).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Optional, Tuple

from ..errors import SpecError, number, unknown_key, whole
from ..mpipe.derive import ZERO_LEVELS   # train.zero: 0 none, 1 optimizer state sharded, 2 gradients too

OPTIMIZERS = ("adam", "sgd")
#: ``train.loss_normalization``: the step loss is the mean over the step's answer tokens (``tokens``,
#: the default) or the mean of its micro-batches' own token means (``micro_batch``)
LOSS_NORMALIZATIONS = ("tokens", "micro_batch")
#: ``train.optimizer_compile``: how MindSpore's optimizer Cell runs its update: its own ``@jit`` graph
#: (``jit``, the default: one compile per run, ~1 s on CPU, then a few ms a step) or the same
#: ``construct`` op by op (``eager``: no compile, bit-identical results, slower per step; for runs of
#: a few steps, such as the test suite's many short cases). MindFormers' AdamW has no ``@jit``: it runs
#: op by op under both.
OPTIMIZER_COMPILES = ("jit", "eager")
#: ``train.nonfinite``: what a step whose loss or global gradient norm is NaN or infinite does, decided
#: before its update and the same on every rank: ``stop`` the run (the default: exit non-zero naming the
#: step; nothing of that step is saved) or ``skip`` that step's update on every rank (as MindSpore's
#: loss-scale overflow check does), logged and counted
NONFINITE_POLICIES = ("stop", "skip")

#: MindFormers optimizer types hyperparallel trains with, and the fields each class takes
#: (``mindformers.core.optim.AdamW``, ``mindspore.nn.Adam``, ``mindspore.nn.SGD``); all run on CPU
OPTIMIZER_FIELDS = {
    "AdamW": ("learning_rate", "betas", "eps", "weight_decay", "use_fused", "amsgrad", "maximize", "swap"),
    "Adam": ("learning_rate", "beta1", "beta2", "eps", "use_locking", "use_nesterov", "weight_decay", "loss_scale",
             "use_amsgrad"),
    "SGD": ("learning_rate", "momentum", "dampening", "weight_decay", "nesterov", "loss_scale"),
}
#: MindFormers' default ``optimizer.learning_rate`` / ``lr_schedule.learning_rate`` (its config template)
MF_DEFAULT_LR = 5.0e-5
#: MindFormers 1.9.0's config template (``GeneralConfig.seed``, ``OptimizerConfig``, ``LrScheduleConfig``):
#: what a MindFormers training recipe gets for a section it leaves out
MF_DEFAULT_SEED = 1
MF_DEFAULT_OPTIMIZER = {"type": "AdamW", "betas": [0.9, 0.999], "learning_rate": MF_DEFAULT_LR, "eps": 1.0e-8,
                        "weight_decay": 0.0}
MF_DEFAULT_LR_SCHEDULE = {"type": "CosineWithWarmUpLR", "learning_rate": MF_DEFAULT_LR, "lr_end": 0.0,
                          "warmup_ratio": 0.0, "total_steps": -1}
#: the ``train:`` keys that make a recipe's optimizer the project's own (not MindFormers' defaults)
OWN_OPTIMIZER_KEYS = ("optimizer", "lr")

#: the learning-rate classes' float fields beyond ``learning_rate`` and ``warmup_ratio`` (checked: finite, >= 0)
LR_FLOATS = ("warmup_lr_init", "lr_end", "num_cycles", "power", "decay_ratio", "decay_start_ratio")
#: MindFormers learning-rate classes (``mindformers.core.lr``) and their fields
LR_FIELDS = {
    "ConstantWarmUpLR": ("learning_rate", "warmup_steps", "warmup_lr_init", "warmup_ratio", "total_steps"),
    "LinearWithWarmUpLR": ("learning_rate", "total_steps", "warmup_steps", "warmup_lr_init", "warmup_ratio"),
    "CosineWithWarmUpLR": ("learning_rate", "warmup_steps", "total_steps", "num_cycles", "lr_end", "warmup_lr_init",
                           "warmup_ratio", "decay_steps", "decay_ratio"),
    "PolynomialWithWarmUpLR": ("learning_rate", "total_steps", "warmup_steps", "lr_end", "power", "warmup_lr_init",
                               "warmup_ratio", "decay_steps"),
    "WarmUpStableDecayLR": ("learning_rate", "lr_end", "warmup_steps", "warmup_lr_init", "warmup_ratio",
                            "total_steps", "decay_start_steps", "decay_start_ratio"),
}


#: a number Python reads that YAML 1.1 (PyYAML) reads as a string: an exponent without a dot in the
#: mantissa or without a sign (``1e-4``, ``1.0e4``), e.g. ``lr: 1e-4``
_EXPONENT = re.compile(r"^([-+]?)([0-9]*)(?:\.([0-9]*))?[eE]([-+]?)([0-9]+)$")


def yaml_float(text: str) -> str:
    """The spelling YAML 1.1 reads as the float ``text`` means (``1e-4`` -> ``1.0e-4``), '' when ``text``
    is not a finite number."""
    t = text.strip()
    try:
        if not math.isfinite(float(t)) or "_" in t:
            return ""
    except ValueError:
        return ""
    m = _EXPONENT.match(t)
    if not m:
        return t
    sign, whole, frac, esign, exp = m.groups()
    if not (whole or frac):
        return ""
    return f"{sign}{whole or '0'}.{frac or '0'}e{esign or '+'}{exp}"


def _not_a_string(key: str, v) -> None:
    """Refuse a number YAML read as a string (``lr: 1e-4``), saying how to write it."""
    if isinstance(v, str) and yaml_float(v):
        raise SpecError(key, f"{v!r} is a string to YAML; write {yaml_float(v)}")


def _number(key: str, v, least: float = 0.0, strict: bool = False) -> float:
    """:func:`~hyperparallel.errors.number`, after saying how to write a number YAML read as a string."""
    _not_a_string(key, v)
    return number(key, v, least, strict)


MAX_SEED = 2 ** 32 - 1        # numpy's and MindSpore's seeds are 32-bit
MAX_STEPS = 10 ** 9           # train.steps, train.save_every
MAX_SECONDS = 7 * 24 * 3600   # train.hang_timeout_s, train.stop_grace_s: a week


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer as MindFormers' ``build_optim`` takes it: ``type`` and the class's keyword arguments
    (``learning_rate`` left out: the schedule gives it). ``grouped``: MindFormers' weight-decay grouping."""

    type: str
    kwargs: Tuple[Tuple[str, object], ...] = ()
    grouped: bool = False

    def get(self, key: str, default=None):
        return dict(self.kwargs).get(key, default)


@dataclass(frozen=True)
class LRSpec:
    """A learning-rate schedule: a MindFormers class and its fields (``total_steps`` resolved to the run's
    steps at build time when -1 or absent), or ``type`` None for a constant ``learning_rate``."""

    type: Optional[str]
    learning_rate: float
    kwargs: Tuple[Tuple[str, object], ...] = ()

    def fields_for(self, total_steps: int) -> dict:
        """The class's keyword arguments for a run of ``total_steps`` steps."""
        kw = dict(self.kwargs, learning_rate=self.learning_rate)
        if kw.get("total_steps") in (None, -1):
            kw["total_steps"] = int(total_steps)
        return kw

    def describe(self, total_steps: int) -> str:
        if self.type is None:
            return f"constant lr {self.learning_rate:g}"
        kw = self.fields_for(total_steps)
        warm = kw.get("warmup_steps")
        if warm is None and kw.get("warmup_ratio") is not None:
            warm = int(kw["total_steps"] * kw["warmup_ratio"])   # MindFormers' _get_lr_steps
        extra = f", {warm} warm-up steps" if warm else ""
        return f"{self.type} (MindFormers) lr {self.learning_rate:g}{extra}, total_steps {kw['total_steps']}"


#: ``runner_wrapper.scale_sense: {type: ...}``: MindSpore's loss-scale update cells (``mindspore.nn``) and
#: the fields each takes; MindFormers' template default for the dynamic one's (65536, 2, 1000)
LOSS_SCALE_CELLS = {"DynamicLossScaleUpdateCell": ("loss_scale_value", "scale_factor", "scale_window"),
                    "FixedLossScaleUpdateCell": ("loss_scale_value",)}
MF_LOSS_SCALE = {"loss_scale_value": 65536, "scale_factor": 2, "scale_window": 1000}
SCALE_KEY = "runner_wrapper.scale_sense"


@dataclass(frozen=True)
class LossScaleSpec:
    """Loss scaling (``runner_wrapper.scale_sense``): the backward's seed on the last stage is the scale, every
    rank unscales its gradients before clipping; a step whose gradients overflow (not finite, loss finite) is
    skipped on every rank; ``dynamic`` then divides the scale by ``factor`` (not below 1) and multiplies it by
    ``factor`` after ``window`` finite steps in a row (MindSpore's ``DynamicLossScaleUpdateCell``)."""

    kind: str          # dynamic | static
    value: float       # the (initial) scale
    factor: int = 2
    window: int = 1000

    def describe(self) -> str:
        if self.kind == "static":
            return f"loss scale {self.value:g} (static, {SCALE_KEY})"
        return (f"loss scale {self.value:g} (dynamic: /{self.factor:g} on overflow, x{self.factor:g} after "
                f"{self.window} finite steps; {SCALE_KEY})")


def loss_scale_of(rw) -> Optional[LossScaleSpec]:
    """``runner_wrapper.scale_sense``: a number (a static scale; 1: none) or ``{type: DynamicLossScaleUpdateCell |
    FixedLossScaleUpdateCell, loss_scale_value, scale_factor, scale_window}``; None: no loss scaling."""
    v = rw.get("scale_sense") if isinstance(rw, dict) else None
    if v is None:
        return None
    if not isinstance(v, dict):
        value = _number(SCALE_KEY, v, 1.0)
        return None if value == 1.0 else LossScaleSpec("static", value)
    kind = _typed(SCALE_KEY, v, LOSS_SCALE_CELLS)
    value = _number(f"{SCALE_KEY}.loss_scale_value", v.get("loss_scale_value", MF_LOSS_SCALE["loss_scale_value"]), 1.0)
    if kind == "FixedLossScaleUpdateCell":
        return None if value == 1.0 else LossScaleSpec("static", value)
    # MindSpore's DynamicLossScaler takes a positive whole factor
    factor = whole(f"{SCALE_KEY}.scale_factor", v.get("scale_factor", MF_LOSS_SCALE["scale_factor"]), 1, 2 ** 16)
    window = whole(f"{SCALE_KEY}.scale_window", v.get("scale_window", MF_LOSS_SCALE["scale_window"]), 1, MAX_STEPS)
    return LossScaleSpec("dynamic", value, int(factor), int(window))


@dataclass(frozen=True)
class TrainConfig:
    """Optimizer, schedule, clipping and loop knobs of a run (see the module docstring)."""

    seed: int = 0
    steps: int = 20
    lr: float = 0.01
    optimizer: str = "adam"       # train: section: adam | sgd
    save_every: int = 0           # checkpoint every N steps with --save-dir (0: only at the end)
    loss_normalization: str = "tokens"   # tokens | micro_batch (LOSS_NORMALIZATIONS)
    hang_timeout_s: float = 20.0  # no rank moved for this long: the job is hung, ended naming the rank
    stop_grace_s: float = 25.0    # after SIGTERM/SIGINT: time to finish the step and save (under k8s' 30 s)
    optimizer_compile: str = "jit"   # jit | eager: how the optimizer Cell's update runs (OPTIMIZER_COMPILES)
    nonfinite: str = "stop"       # stop | skip: a step with a NaN/infinite loss or grad norm (NONFINITE_POLICIES)
    zero: int = 0                 # ZeRO over the data-parallel replicas: 0, 1 (optimizer state), 2 (+ grads)
    # resolved (from_raw): the optimizer and schedule every rank builds, and gradient clipping
    opt: OptimizerSpec = field(default=None, compare=False)
    schedule: LRSpec = field(default=None, compare=False)
    max_grad_norm: Optional[float] = None   # clip the global gradient norm to this (MindFormers' ClipGradNorm)
    loss_scale: Optional[LossScaleSpec] = None   # runner_wrapper.scale_sense (None: no loss scaling)
    steps_given: bool = False               # train.steps was written (else the default, or runner_config.epochs)
    keys: Tuple[Tuple[str, str], ...] = ()  # setting -> the recipe key that gave it (logs)

    TRAIN_KEYS = ("seed", "steps", "lr", "optimizer", "save_every", "loss_normalization", "hang_timeout_s",
                  "stop_grace_s", "optimizer_compile", "nonfinite", "zero")

    @staticmethod
    def from_section(sec: Optional[dict]) -> "TrainConfig":
        """The ``train:`` section alone (recipes without MindFormers sections)."""
        return TrainConfig.from_raw({"train": sec} if sec is not None else {})

    @staticmethod
    def from_raw(raw: dict) -> "TrainConfig":
        """The run's training settings from the recipe: MindFormers' sections where given, else ``train:``."""
        sec = raw.get("train")
        if sec is None:
            sec = {}
        if not isinstance(sec, dict):
            raise SpecError("train", f"must be a mapping (keys: {', '.join(TrainConfig.TRAIN_KEYS)}), got {sec!r}")
        if set(sec) - set(TrainConfig.TRAIN_KEYS):
            raise unknown_key("train", sec, TrainConfig.TRAIN_KEYS)
        for key, least, most in (("seed", 0, MAX_SEED), ("steps", 1, MAX_STEPS), ("save_every", 0, MAX_STEPS)):
            if key in sec:
                whole(f"train.{key}", sec[key], least, most)
        if "lr" in sec:
            _number("train.lr", sec["lr"], 0.0, strict=True)
        for key in ("hang_timeout_s", "stop_grace_s"):
            if key in sec:
                _number(f"train.{key}", sec[key], 0.0, strict=True)
                if sec[key] > MAX_SECONDS:
                    raise SpecError(f"train.{key}", f"must be a number of seconds > 0 and <= {MAX_SECONDS:,}, "
                                                    f"got {sec[key]!r}")
        if "optimizer" in sec and sec["optimizer"] not in OPTIMIZERS:
            raise SpecError("train.optimizer", f"{sec['optimizer']!r} unknown; allowed: {', '.join(OPTIMIZERS)} "
                                               "(or MindFormers' optimizer: section)")
        mf = mindformers_training(raw)
        norm, keys_loss = _loss_normalization(raw, sec, mf)
        compile_mode = sec.get("optimizer_compile", "jit")
        if compile_mode not in OPTIMIZER_COMPILES:
            raise SpecError("train.optimizer_compile",
                            f"{compile_mode!r} unknown; allowed: {', '.join(OPTIMIZER_COMPILES)}")
        nonfinite = sec.get("nonfinite", "stop")
        if nonfinite not in NONFINITE_POLICIES:
            raise SpecError("train.nonfinite", f"{nonfinite!r} unknown; allowed: {', '.join(NONFINITE_POLICIES)}")
        zero, keys_zero = zero_of(raw)
        keys = {"loss": keys_loss, "zero": keys_zero}
        seed = sec.get("seed", MF_DEFAULT_SEED if mf else 0)
        keys["seed"] = "train.seed" if "seed" in sec else ("MindFormers' default" if mf else "default")
        if "seed" in raw:
            if "seed" in sec and sec["seed"] != raw["seed"]:
                raise SpecError("train.seed", f"{sec['seed']!r} contradicts the top-level seed {raw['seed']!r}; give "
                                              "it in one place")
            seed = whole("seed", raw["seed"], 0, MAX_SEED)
            keys["seed"] = "seed"
        mf_opt, mf_lr = raw.get("optimizer"), raw.get("lr_schedule")
        for k in ("optimizer", "lr"):
            if k in sec and (mf_opt is not None or mf_lr is not None):
                mf_sec = "optimizer" if mf_opt is not None else "lr_schedule"
                raise SpecError(f"train.{k}", f"given with MindFormers' {mf_sec}: section; give the optimizer and "
                                              "learning rate in one place")
        if mf:
            opt, sched = _mindformers_optimizer(mf_opt, mf_lr)
            keys["optimizer"] = "optimizer" if mf_opt is not None else "MindFormers' default"
            keys["lr"] = "lr_schedule" if mf_lr is not None else "MindFormers' default"
        else:
            name = sec.get("optimizer", "adam")
            lr = float(sec.get("lr", 0.01))
            # the train: section's update rules: Adam with MindSpore's defaults, SGD with momentum 0.9
            opt = OptimizerSpec("Adam") if name == "adam" else OptimizerSpec("SGD", (("momentum", 0.9),))
            sched = LRSpec(None, lr)
            keys["optimizer"] = "train.optimizer" if "optimizer" in sec else "default"
            keys["lr"] = "train.lr" if "lr" in sec else "default"
        rw = raw.get("runner_wrapper")
        if rw is None:   # MindFormers' template: MFTrainOneStepCell with use_clip_grad: true (max_grad_norm 1.0)
            clip = _clipping({}, True) if mf else None
        else:
            clip = _clipping(rw, _wrapper_clips_by_default(rw, _pipeline_stage(raw)))
        keys["clip"] = "runner_wrapper" if rw is not None else ("MindFormers' default" if mf else "none")
        return TrainConfig(loss_scale=loss_scale_of(rw),seed=seed, steps=sec.get("steps", 20), lr=sched.learning_rate,
                           optimizer=opt.type.lower() if opt.type in ("Adam", "SGD") and not opt.grouped else opt.type,
                           save_every=sec.get("save_every", 0), opt=opt,
                           hang_timeout_s=float(sec.get("hang_timeout_s", 20.0)),
                           stop_grace_s=float(sec.get("stop_grace_s", 25.0)), schedule=sched, max_grad_norm=clip,
                           steps_given="steps" in sec, keys=tuple(sorted(keys.items())), loss_normalization=norm,
                           optimizer_compile=compile_mode, nonfinite=nonfinite, zero=zero)

    def describe(self, total_steps: int) -> str:
        """One line for the start of a run: optimizer, schedule, clipping, seed."""
        kw = ", ".join(f"{k}={v}" for k, v in self.opt.kwargs)
        keys = dict(self.keys)
        clip = (f"clip grad norm {self.max_grad_norm:g} ({keys.get('clip', 'runner_wrapper')})" if self.max_grad_norm
                else "no clipping")
        loss = "mean over answer tokens" if self.loss_normalization == "tokens" else "mean of micro-batch means"
        update = ", update op by op (train.optimizer_compile: eager)" if self.optimizer_compile == "eager" else ""
        skip = ", non-finite steps skipped (train.nonfinite: skip)" if self.nonfinite == "skip" else ""
        skip += f", {self.loss_scale.describe()}" if self.loss_scale else ""
        return (f"optimizer {self.opt.type}{' (' + kw + ')' if kw else ''}{update}, "
                f"{self.schedule.describe(total_steps)}, {clip}, seed {self.seed} ({keys['seed']}), loss {loss}{skip}")


def zero_of(raw: dict) -> Tuple[int, str]:
    """(ZeRO level, the key that gave it) from ``train.zero`` or MindFormers' ``parallel_config.optimizer_shard``
    (``true`` reads as level 1: optimizer state sharded over the data-parallel replicas, gradients all-reduced).
    Both given and disagreeing is refused naming both. Whether the level has replicas to shard over is the
    plan's check (``parallel_config.data_parallel`` > 1)."""
    sec = raw.get("train") if isinstance(raw.get("train"), dict) else {}
    pc = raw.get("parallel_config") if isinstance(raw.get("parallel_config"), dict) else {}
    level, key = 0, "default"
    if "zero" in sec:
        z = sec["zero"]
        if isinstance(z, bool) or z not in ZERO_LEVELS:
            raise SpecError("train.zero", f"{z!r} unknown; allowed: {', '.join(map(str, ZERO_LEVELS))}")
        level, key = int(z), "train.zero"
    shard = pc.get("optimizer_shard")
    if shard is not None:
        if not isinstance(shard, bool):
            raise SpecError("parallel_config.optimizer_shard", f"must be true or false, got {shard!r}")
        if "zero" in sec and level != (1 if shard else 0):
            raise SpecError("train.zero", f"{level} contradicts parallel_config.optimizer_shard: "
                                          f"{str(shard).lower()} (which reads as train.zero {1 if shard else 0}); "
                                          "give it in one place")
        if shard:
            level, key = 1, "parallel_config.optimizer_shard"
    return level, key


def zero_line(level: int, key: str, D: int) -> str:
    """One line saying what the ZeRO level means here ("" at level 0): ``parallel_config.optimizer_shard:
    true`` reads as level 1."""
    if not level:
        return ""
    given = "parallel_config.optimizer_shard: true" if key == "parallel_config.optimizer_shard" else f"{key}: {level}"
    what = ("optimizer state sharded over the data-parallel replicas, gradients all-reduced" if level == 1 else
            "optimizer state and gradients sharded over the data-parallel replicas (gradients reduce-scattered)")
    return f"ZeRO level {level} ({given}): {what}, D={D}"


def _typed(name: str, sec, classes: dict) -> str:
    """The ``type`` of a MindFormers ``{type: Class, ...}`` section, its fields checked against the class's."""
    if not isinstance(sec, dict):
        raise SpecError(name, f"must be a mapping with type ({', '.join(classes)}), got {sec!r}")
    t = sec.get("type")
    if t not in classes:
        raise SpecError(f"{name}.type", f"{t!r} is not supported; allowed: {', '.join(classes)}")
    known = ("type",) + classes[t]
    if set(sec) - set(known):
        raise unknown_key(name, sec, known, f"for {t}")
    return t


def _mindformers_optimizer(opt, sched) -> Tuple[OptimizerSpec, LRSpec]:
    """MindFormers' ``optimizer`` and ``lr_schedule`` sections, checked field by field."""
    default_sched = sched is None
    if opt is None:   # MindFormers' template (OptimizerConfig); its learning_rate is the schedule's
        opt = {k: v for k, v in MF_DEFAULT_OPTIMIZER.items() if k != "learning_rate"}
    if sched is None:
        sched = MF_DEFAULT_LR_SCHEDULE   # MindFormers' template (LrScheduleConfig), built even beside an optimizer
    t = _typed("optimizer", opt, OPTIMIZER_FIELDS)
    kw = {k: v for k, v in opt.items() if k not in ("type", "learning_rate")}
    if "weight_decay" in kw:
        _number("optimizer.weight_decay", kw["weight_decay"])
    if "eps" in kw:
        _number("optimizer.eps", kw["eps"], 0.0, strict=True)
    if "betas" in kw:
        b = kw["betas"]
        for x in (b if isinstance(b, (list, tuple)) else ()):
            _not_a_string("optimizer.betas", x)
        if not (isinstance(b, (list, tuple)) and len(b) == 2 and all(
                not isinstance(x, bool) and isinstance(x, (int, float)) and 0 <= x < 1 for x in b)):
            raise SpecError("optimizer.betas", f"must be two numbers in [0, 1), got {b!r}")
        kw["betas"] = tuple(float(x) for x in b)
    for k in ("beta1", "beta2", "momentum", "dampening"):
        if k in kw:
            _number(f"optimizer.{k}", kw[k])
    for k in ("use_fused", "amsgrad", "maximize"):   # MindFormers' AdamW needs use_fused for the other two
        if kw.get(k):
            raise SpecError(f"optimizer.{k}", f"{kw[k]!r} is not supported (hyperparallel builds MindFormers' "
                                              "BasicAdamW); give false")
    if kw.get("swap"):
        raise SpecError("optimizer.swap", "true (optimizer state offload) is not supported; give false")
    _not_a_string("optimizer.loss_scale", kw.get("loss_scale"))
    if kw.get("loss_scale", 1.0) != 1.0:
        raise SpecError("optimizer.loss_scale", f"{kw['loss_scale']!r}: the optimizer's own loss scale is not "
                                                "supported; give 1.0 (the loss scale is runner_wrapper.scale_sense)")
    st = _typed("lr_schedule", sched, LR_FIELDS)
    if "learning_rate" not in sched:
        raise SpecError("lr_schedule.learning_rate", "missing")
    lr = _number("lr_schedule.learning_rate", sched["learning_rate"], 0.0, strict=True)
    if "learning_rate" in opt:
        _number("optimizer.learning_rate", opt["learning_rate"], 0.0, strict=True)
    for k in LR_FLOATS:
        if sched.get(k) is not None:
            _number(f"lr_schedule.{k}", sched[k])
    if "learning_rate" in opt and opt["learning_rate"] != sched["learning_rate"] and default_sched:
        raise SpecError("optimizer.learning_rate",
                        f"{opt['learning_rate']!r} is not used by MindFormers without an lr_schedule: section "
                        f"(its template's CosineWithWarmUpLR from {MF_DEFAULT_LR:g} replaces it); give "
                        f"lr_schedule: {{type: CosineWithWarmUpLR, learning_rate: {opt['learning_rate']!r}}} "
                        "(or ConstantWarmUpLR for a constant rate), or leave optimizer.learning_rate out")
    if "learning_rate" in opt and opt["learning_rate"] != sched["learning_rate"]:
        raise SpecError("optimizer.learning_rate", f"{opt['learning_rate']!r} contradicts lr_schedule.learning_rate "
                                                   f"{sched['learning_rate']!r}; MindFormers uses the schedule's: give "
                                                   "it in one place")
    ts = sched.get("total_steps")
    if ts is not None and ts != -1:
        whole("lr_schedule.total_steps", ts, 1)
    if sched.get("warmup_ratio") is not None and not 0 <= _number("lr_schedule.warmup_ratio",
                                                                  sched["warmup_ratio"]) <= 1:
        raise SpecError("lr_schedule.warmup_ratio", f"must be in [0, 1], got {sched['warmup_ratio']!r}")
    if sched.get("warmup_steps") is not None:
        whole("lr_schedule.warmup_steps", sched["warmup_steps"], 0)
    lr_spec = LRSpec(st, lr, tuple(sorted((k, v) for k, v in sched.items() if k not in ("type", "learning_rate"))))
    return OptimizerSpec(t, tuple(sorted(kw.items())), grouped=True), lr_spec


def _pipeline_stage(raw: dict) -> int:
    """``parallel_config.pipeline_stage`` (MindFormers' default 1; checked by the recipe reader)."""
    pc = raw.get("parallel_config")
    p = pc.get("pipeline_stage", 1) if isinstance(pc, dict) else 1
    return p if isinstance(p, int) and not isinstance(p, bool) else 1


def _wrapper_clips_by_default(rw, pipeline_stage: int) -> bool:
    """Whether MindFormers' train-step wrapper clips when ``runner_wrapper`` leaves ``use_clip_grad`` out:
    with pipeline stages its trainer swaps the wrapper for ``MFPipelineWithLossScaleCell``
    (``use_clip_grad=True``); without, the named class's default (``MFTrainOneStepCell``: False; MindSpore's
    ``TrainOneStepCell`` classes do not clip)."""
    kind = rw.get("type", "MFTrainOneStepCell") if isinstance(rw, dict) else None
    return pipeline_stage > 1 or kind == "MFPipelineWithLossScaleCell"


def _clipping(rw, use_default: bool) -> Optional[float]:
    """``runner_wrapper.use_clip_grad`` (``use_default`` when absent) / ``max_grad_norm`` (default 1.0, the
    wrappers'); None: no clipping."""
    if not isinstance(rw, dict):
        raise SpecError("runner_wrapper", f"must be a mapping, got {rw!r}")
    use = rw.get("use_clip_grad", use_default)
    if not isinstance(use, bool):
        raise SpecError("runner_wrapper.use_clip_grad", f"must be true or false, got {use!r}")
    if not use:
        if "max_grad_norm" in rw:
            _number("runner_wrapper.max_grad_norm", rw["max_grad_norm"], 0.0, strict=True)
        return None
    return _number("runner_wrapper.max_grad_norm", rw.get("max_grad_norm", 1.0), 0.0, strict=True)


def mindformers_training(raw: dict) -> bool:
    """Whether MindFormers' training defaults fill what the recipe leaves out: a MindFormers config
    (``model.model_config`` / ``arch`` / ..., or MindFormers' ``optimizer`` / ``lr_schedule`` section) whose
    ``train:`` section does not give the optimizer the project's way (``train.optimizer`` / ``train.lr``)."""
    from .mindformers import is_mindformers_config
    sec = raw.get("train") if isinstance(raw.get("train"), dict) else {}
    if set(OWN_OPTIMIZER_KEYS) & set(sec):
        return False
    return is_mindformers_config(raw) or raw.get("optimizer") is not None or raw.get("lr_schedule") is not None


def _loss_normalization(raw: dict, sec: dict, mf: bool) -> Tuple[str, str]:
    """(``train.loss_normalization`` value, the key that gave it): ``train.loss_normalization``, else
    MindFormers' ``calculate_per_token_loss`` (true: ``tokens``, the step's token mean; false:
    ``micro_batch``, the mean of the micro-batch means, as MindFormers' PipelineCell / GradAccumulationCell
    average them), else ``micro_batch`` for a MindFormers training recipe (MindFormers' default false) and
    ``tokens`` for the project's own."""
    cptl = raw.get("calculate_per_token_loss")
    if cptl is not None and not isinstance(cptl, bool):
        raise SpecError("calculate_per_token_loss", f"must be true or false, got {cptl!r}")
    mapped = None if cptl is None else ("tokens" if cptl else "micro_batch")
    if "loss_normalization" in sec:
        norm = sec["loss_normalization"]
        if norm not in LOSS_NORMALIZATIONS:
            raise SpecError("train.loss_normalization",
                            f"{norm!r} unknown; allowed: {', '.join(LOSS_NORMALIZATIONS)}")
        if mapped is not None and mapped != norm:
            raise SpecError("train.loss_normalization", f"{norm!r} contradicts calculate_per_token_loss "
                                                        f"{str(cptl).lower()} ({mapped}); give it in one place")
        return norm, "train.loss_normalization"
    if mapped is not None:
        return mapped, "calculate_per_token_loss"
    return ("micro_batch", "MindFormers' default") if mf else ("tokens", "default")


def one_micro_batch_without_pipeline(raw: dict, pipeline_stage: int, micro_batch_num: int) -> None:
    """Refuse ``parallel_config.micro_batch_num`` > 1 with ``pipeline_stage: 1`` in a MindFormers training
    recipe: MindFormers' trainer resets it to 1 there (``_check_global_batch_size_for_auto_parallel``),
    training ``micro_batch_num`` times fewer samples a step than hyperparallel would accumulate."""
    if pipeline_stage == 1 and micro_batch_num > 1 and mindformers_training(raw):
        raise SpecError("parallel_config.micro_batch_num",
                        f"{micro_batch_num} with pipeline_stage 1: MindFormers resets it to 1 (a step of "
                        f"data_parallel x batch_size samples, no accumulation), hyperparallel would accumulate "
                        f"{micro_batch_num}; give 1 (or pipeline_stage >= 2)")


# keep dataclass field introspection for the README table (``train:`` keys and defaults)
TRAIN_DEFAULTS = {f.name: f.default for f in fields(TrainConfig) if f.name in TrainConfig.TRAIN_KEYS}
