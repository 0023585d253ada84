"""Recipes: MindFormers YAML with a ``parallel_config`` and an ``mpipe:`` section.

Keys read: ``parallel_config.{pipeline_stage, micro_batch_num, data_parallel, seq_split_num}``,
``pp_interleave_num`` from ``parallel_config`` (hyperparallel's spelling) or
``model.model_config`` (MindFormers 1.9's), ``parallel.pipeline_config``, ``device``, and
the ``mpipe:`` section:

* ``schedule``: short name or list form (see :mod:`hyperparallel.mpipe.schedule`); without it
  the schedule comes from ``parallel.pipeline_config`` (see :mod:`.mindformers`);
* ``profile``: per-region costs; optional when ``model.model_config`` gives the layer
  counts (the language model's and its towers', see :func:`.mindformers.towers`),
  then every layer costs one unit and ``freeze_*`` flags set ``trainable``;
* ``encoder``: ``{owners, backward, spill, optimizer, trainable}``, options of the encoder regions
  (the transpose options fill in what the schedule does not say; ``trainable`` sets
  every region before the pipelined one);
* ``memory_limit_gb``: per-device memory; a plan whose predicted peak exceeds it on some device
  is flagged by plan/simulate and refused by train (:mod:`.memory`);
* ``compile``: ``jit`` (default) or ``eager``, how the ranks run every chunk's forward, and
  ``compile_fallback``: ``error`` (default) or ``eager``, what a rank does when a compile fails
  (:mod:`hyperparallel.runtime.compiled`).

A MindFormers config (``model:`` with ``model_config`` or ``arch``) is planned as MindFormers
runs it: V is 1 unless ``pipeline_interleave`` is true, and the language model's layers per
chunk follow ``model.model_config.offset`` by MindFormers' rule. The project's own recipes
split the layers evenly. Every refusal is a :class:`~hyperparallel.errors.SpecError`
naming the key.
"""
from __future__ import annotations

import math

from contextlib import contextmanager

from dataclasses import dataclass, field, replace
from typing import Iterable, Optional, Sequence, Tuple

from ..mpipe import bounds, orders
from ..mpipe.check import assert_valid
from ..mpipe.cut import split_layers
from ..mpipe.derive import check_zero, derive
from ..mpipe.ir import Plan
from ..mpipe.memory import FIELD as MEMORY_FIELD
from ..errors import SpecError, unknown_key, whole
from ..mpipe.profile import ModelProfile, TiedWeight, parse_profile
from ..mpipe import recompute as rc
from ..mpipe.schedule import Schedule, parse_schedule
from . import mindformers as mf
from . import estimate, schema
from .train import TrainConfig, zero_line, zero_of
from .files import apply_override, load_raw

MPIPE_KEYS = ("schedule", "profile", "encoder", "memory_limit_gb", "compile", "compile_fallback", "recompute")
#: ``mpipe.compile``: how every chunk's forward runs (``jit``: one compiled MindSpore graph per input
#: shape, run under the tape; ``eager``: op by op); ``mpipe.compile_fallback``: what a rank does when a
#: chunk's compile fails at run time (``error``: the job stops naming rank and chunk; ``eager``: that
#: chunk runs eager, logged)
COMPILE_MODES = ("jit", "eager")
COMPILE_FALLBACKS = ("error", "eager")
ENCODER_KEYS = ("owners", "backward", "spill", "optimizer", "trainable")
TRANSPOSE_KEYS = ("owners", "backward", "spill", "optimizer")   # the encoder keys that are transpose options
DEVICES = ("CPU", "Ascend")
#: Keys the recipe front end reads that a recipe may leave out (a ``--set`` may add them).
READ_KEYS = (("device", "parallel_config.data_parallel", "parallel_config.model_parallel",
              "parallel_config.pp_interleave_num",
              "parallel_config.seq_split_num", "mpipe.schedule", "mpipe.profile", "mpipe.encoder",
              "mpipe.compile", "mpipe.compile_fallback", "mpipe.recompute")
             + tuple(f"mpipe.encoder.{k}" for k in ENCODER_KEYS))


@dataclass
class Recipe:
    path: Optional[str]
    raw: dict
    pipeline_stage: int
    micro_batch_num: int
    pp_interleave_num: int
    data_parallel: int
    profile: ModelProfile
    zero: int = 0      # ZeRO over the data-parallel replicas (train.zero / parallel_config.optimizer_shard)
    schedule: object = "1f1b"   # the spec as the recipe gives it (text or list form)
    device: str = "CPU"
    overrides: list = field(default_factory=list)
    encoder: dict = field(default_factory=dict)   # mpipe.encoder options
    v_key: str = "parallel_config.pp_interleave_num"  # the key that set V (named in errors)
    layout: Optional[dict] = None  # MindFormers layer layout of the pipelined region: num_layers, offset, key
    costs: str = "mpipe.profile"   # where the profile's costs come from (an estimate is said so)
    memory_limit_gb: Optional[float] = None   # per device (mpipe.memory_limit_gb)
    v_note: str = ""   # why a given pp_interleave_num > 1 reads as V = 1 (appended to errors about V)
    notes: Tuple[str, ...] = ()   # lines plan/check/simulate print once: keys read but without effect on the plan
    # the pipelined region's recompute as the recipe gives it: (key, value) of ``mpipe.recompute`` or MindFormers'
    # ``recompute_config.recompute``; None: neither (the schedule's own, default none)
    recompute: Optional[Tuple[str, object]] = None
    tensor_parallel: int = 1   # T: parallel_config.model_parallel, the tensor-parallel ranks of each stage
    # the training settings, parsed once with the rest (a TrainConfig), or the SpecError ``train`` refuses them
    # with (a MindFormers value plan/check/simulate only note): read through ``train``
    train_parsed: object = field(default=None, repr=False, compare=False)

    @property
    def train(self) -> TrainConfig:
        """The run's training settings (:class:`~.train.TrainConfig`), parsed with the recipe; a MindFormers
        training value the runtime cannot train with (noted by plan/check/simulate) is refused here."""
        if isinstance(self.train_parsed, SpecError):
            raise self.train_parsed
        return self.train_parsed

    @property
    def ranks(self) -> int:
        """The ranks a run of this recipe launches: pipeline_stage x data_parallel x model_parallel."""
        return self.pipeline_stage * self.data_parallel * self.tensor_parallel

    @property
    def estimated(self) -> bool:
        """The costs are not the recipe's own ``mpipe.profile`` (estimated from the model config)."""
        return self.costs != "mpipe.profile"

    @property
    def transpose_defaults(self) -> dict:
        """The ``mpipe.encoder`` options a transposed region takes where its schedule gives none."""
        return {k: v for k, v in self.encoder.items() if k in TRANSPOSE_KEYS}

    def chunk_layers(self, order: str) -> Optional[Tuple[int, ...]]:
        """Layers of every chunk of the pipelined region by MindFormers' rule (None: the even split)."""
        if self.layout is None:
            return None
        with self._v_noted():
            return mf.layer_layout(self.layout["num_layers"], self.layout["offset"], self.pipeline_stage,
                                   self.pp_interleave_num, self.layout["key"], zbv=order == "zbv")

    @contextmanager
    def _v_noted(self):
        """A refusal about V (its key, or pp_interleave_num in the text) says why a given V > 1 reads as 1."""
        try:
            yield
        except SpecError as e:
            text = str(e)[len(e.field) + 2:]
            if not self.v_note or (e.field != self.v_key and "pp_interleave_num" not in text):
                raise
            raise SpecError(e.field, f"{text}; {self.v_note}") from None

    def plan_schedule(self, schedule=None) -> Schedule:
        """The parsed schedule to derive: the recipe's (or ``schedule``), with the ``mpipe.encoder``
        options for what it leaves out, its pipe order checked against P, V, M (errors name the key
        that set V), and the recipe's cut of the pipelined region."""
        spec = self.schedule if schedule is None else schedule
        sched = parse_schedule(spec, self.profile, V=self.pp_interleave_num, transpose=self.transpose_defaults)
        body, pipe = sched.body
        with self._v_noted():
            orders.validate(pipe.order, self.pipeline_stage, self.pp_interleave_num, self.micro_batch_num,
                            v_key=self.v_key)
        spec = self.recompute_spec(pipe.order)
        if spec is not None:
            if pipe.recompute not in (rc.NONE, spec):
                raise SpecError(self.recompute[0], f"{self.recompute[1]!r} contradicts the schedule's recompute of "
                                                   f"{body!r} ({pipe.recompute}); give it in one place")
            pipe = replace(pipe, recompute=spec)
            sched = replace(sched, parts=sched.parts[:-1] + ((body, pipe),))
        layers = self.chunk_layers(pipe.order)
        if layers is None:
            return sched
        if pipe.layers is not None and tuple(pipe.layers) != layers:
            raise SpecError(f"schedule.{body}.layers", f"{list(pipe.layers)} contradicts {self.layout['key']} "
                                                       f"(layers per chunk {list(layers)}); give it in one place")
        return replace(sched, parts=sched.parts[:-1] + ((body, replace(pipe, layers=layers)),))

    def recompute_spec(self, order: str):
        """The pipelined region's recompute option the recipe gives (None: none given), checked: a region
        without backward (every region frozen) refuses it, naming the key."""
        if self.recompute is None:
            return None
        key, value = self.recompute
        if key == mf.RECOMPUTE_KEY:
            with self._v_noted():
                spec = mf.recompute_of(value, self.pipeline_stage, self.pp_interleave_num, key, zbv=order == "zbv")
        else:
            spec = rc.parse(key, value)
        if rc.is_on(spec) and not any(r.trainable for r in self.profile.regions):
            allowed = "false" if key == mf.RECOMPUTE_KEY else "none"
            raise SpecError(key, f"{value!r}: {self.profile.regions[-1].name!r} has no backward (every region is "
                                 f"frozen): there is nothing to recompute; allowed: {allowed}")
        body = self.profile.regions[-1]
        sizes = self.chunk_layers(order) or split_layers(body.layers, self.pipeline_stage * self.pp_interleave_num)
        rc.per_chunk(key, spec, sizes)   # a count above a chunk's layers: refused naming this key
        return spec


# -- the sections ------------------------------------------------------------------------------

def _model_config(raw: dict) -> dict:
    return mf.model_config(raw)


#: ``TransformerOpParallelConfig``'s defaults (MindFormers 1.9.0): what a MindFormers config without these
#: keys (a predict or export config) runs with
MINDFORMERS_PARALLEL_DEFAULTS = {"pipeline_stage": 1, "micro_batch_num": 1}


def parallel_defaults_note(raw: dict) -> str:
    """The note naming the ``parallel_config`` keys a MindFormers config leaves to MindFormers' defaults."""
    pc = raw.get("parallel_config") if isinstance(raw.get("parallel_config"), dict) else {}
    absent = [f"parallel_config.{k}: {v}" for k, v in MINDFORMERS_PARALLEL_DEFAULTS.items() if k not in pc]
    if not absent or not mf.is_mindformers_config(raw):
        return ""
    return f"note: absent, so MindFormers' defaults (TransformerOpParallelConfig): {', '.join(absent)}"


def _parallel(raw: dict) -> Tuple[int, int, int, int, str, str]:
    """(P, M, V, D, the key that set V, why a given V > 1 reads as 1 or '') from ``parallel_config`` and
    MindFormers' V keys."""
    pc = raw.get("parallel_config")
    if pc is not None and not isinstance(pc, dict):
        raise SpecError("parallel_config", f"must be a mapping with pipeline_stage and micro_batch_num, got "
                                           f"{type(pc).__name__} {pc!r}")
    if not isinstance(pc, dict):
        if not mf.is_mindformers_config(raw):
            raise SpecError("parallel_config", "missing; give pipeline_stage and micro_batch_num "
                                               "(and optional pp_interleave_num, data_parallel)")
        pc = {}
    for k in ("pipeline_stage", "micro_batch_num"):
        if k not in pc and not mf.is_mindformers_config(raw):
            raise SpecError(f"parallel_config.{k}", "missing")
    pc = {**MINDFORMERS_PARALLEL_DEFAULTS, **pc}
    v_key, v = "parallel_config.pp_interleave_num", pc.get("pp_interleave_num", 1)
    mc_v = _model_config(raw).get("pp_interleave_num")
    if mc_v is not None:
        if "pp_interleave_num" in pc and pc["pp_interleave_num"] != mc_v:
            raise SpecError("parallel_config.pp_interleave_num",
                            f"{pc['pp_interleave_num']!r} differs from model.model_config.pp_interleave_num "
                            f"{mc_v!r}; give one of them")
        v_key, v = "model.model_config.pp_interleave_num", mc_v
    P, M, V, D = (bounds.at_most(key, whole(key, value), bound) for key, value, bound in (
        ("parallel_config.pipeline_stage", pc["pipeline_stage"], bounds.MAX_PIPELINE_STAGE),
        ("parallel_config.micro_batch_num", pc["micro_batch_num"], bounds.MAX_MICRO_BATCH),
        (v_key, v, bounds.MAX_INTERLEAVE),
        ("parallel_config.data_parallel", pc.get("data_parallel", 1), bounds.MAX_DATA_PARALLEL)))
    interleave = mf.pipeline_interleave(raw)
    note = ""
    if interleave is False or (interleave is None and mf.is_mindformers_config(raw)):
        # MindFormers' LayerSetting: pp_interleave_num only counts with pipeline_interleave on
        # (MindSpore's default is off)
        if V != 1:
            why = "is false" if interleave is False else "is absent (MindSpore's default: false)"
            note = (f"{v_key}: {V} reads as 1 because parallel.pipeline_config.pipeline_interleave {why}; "
                    "set parallel.pipeline_config.pipeline_interleave: true (with pipeline_scheduler) to turn "
                    "virtual stages on (MindFormers' rule)")
        V = 1
    mf.seq_split_num(raw)
    return P, M, V, D, v_key, note


def tensor_parallel_of(raw: dict) -> int:
    """T, ``parallel_config.model_parallel`` (default 1): a whole number 1..MAX_TENSOR_PARALLEL. Whether the
    model can split its layers T ways is the model adapter's to say (``check_tensor_parallel``)."""
    pc = raw.get("parallel_config") if isinstance(raw.get("parallel_config"), dict) else {}
    key = "parallel_config.model_parallel"
    T = bounds.at_most(key, whole(key, pc.get("model_parallel", 1)), bounds.MAX_TENSOR_PARALLEL)
    return T


UNIT = dict(forward_ms=1.0, backward_ms=1.0, weight_ms=1.0, activation_mb=1.0, output_mb=1.0, param_mb=1.0)


def _batch(raw: dict) -> int:
    """Sequences per micro-batch: ``data.micro_batch_size``, else MindFormers' batch-size keys, else 1."""
    data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    v = data.get("micro_batch_size")
    if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 65_536:
        return v
    for _, v in schema.batch_size_keys(raw):
        if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 65_536:
            return v
    return 1


def _profile_from_model_config(raw: dict) -> Tuple[Optional[dict], str]:
    """(profile, where its costs come from) built from the model section's towers, or (None, '').

    Costs are estimated from the towers' sizes (:mod:`.estimate`); a tower without sizes (only a layer
    count) gives every layer one unit of cost, said so."""
    ts = mf.model_towers(raw)
    if not ts:
        return None, ""
    data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    prof, note = estimate.estimated_profile(ts, _model_config(raw), data, device_of(raw), _batch(raw))
    if prof is not None:
        return prof, note
    return ({"regions": [dict(name=t.name, layers=t.layers, trainable=True, **UNIT) for t in ts]},
            f"unit costs: every layer costs 1 ({note}, so no FLOPs to estimate); give mpipe.profile")


def _mpipe(raw: dict) -> Tuple[dict, dict]:
    """The ``mpipe`` section and its ``encoder`` options, keys checked."""
    mp = raw.get("mpipe")
    if mp is None and mf.is_mindformers_config(raw) and mf.model_towers(raw):
        mp = {}
    if not isinstance(mp, dict):
        d = raw.get("pretrained_model_dir")
        where = f"; pretrained_model_dir {d!r} holds no config.json to read them from" if d else ""
        raise SpecError("mpipe", "missing; add an mpipe: section (schedule, and profile unless "
                                 f"model.model_config gives the layer counts){where}")
    unknown = sorted(set(mp) - set(MPIPE_KEYS))
    if unknown:
        raise unknown_key("mpipe", mp, MPIPE_KEYS)
    enc = mp.get("encoder") or {}
    if not isinstance(enc, dict):
        raise SpecError("mpipe.encoder", f"must be a mapping with keys {', '.join(ENCODER_KEYS)}")
    bad = sorted(set(enc) - set(ENCODER_KEYS))
    if bad:
        raise unknown_key("mpipe.encoder", enc, ENCODER_KEYS)
    if "trainable" in enc and not isinstance(enc["trainable"], bool):
        raise SpecError("mpipe.encoder.trainable", f"must be true or false, got {enc['trainable']!r}")
    from ..mpipe.schedule import BACKWARDS, OWNERS, SPILLS
    for opt, allowed in zip(TRANSPOSE_KEYS, (OWNERS, BACKWARDS, SPILLS)):
        if opt in enc and not isinstance(enc[opt], str):
            raise SpecError(f"mpipe.encoder.{opt}", f"must be a name, got {enc[opt]!r}")
        if opt in enc and enc[opt] not in allowed:   # named here: the schedule only takes it as a default
            raise SpecError(f"mpipe.encoder.{opt}", f"{enc[opt]!r} unknown; allowed: {', '.join(allowed)}")
    compile_settings(raw)
    return mp, dict(enc)


def compile_settings(raw: dict) -> Tuple[str, str]:
    """(``mpipe.compile``, ``mpipe.compile_fallback``) of a raw recipe, defaults ``jit`` and ``error``;
    another value is a SpecError naming the key and the allowed values."""
    mp = raw.get("mpipe") if isinstance(raw.get("mpipe"), dict) else {}
    out = []
    for key, allowed in (("compile", COMPILE_MODES), ("compile_fallback", COMPILE_FALLBACKS)):
        v = mp.get(key, allowed[0])
        if not isinstance(v, str) or v not in allowed:
            raise SpecError(f"mpipe.{key}", f"{v!r} unknown; allowed: {', '.join(allowed)}")
        out.append(v)
    return out[0], out[1]


def _recompute(raw: dict, mp: dict) -> Optional[Tuple[str, object]]:
    """(key, value) of the recipe's recompute: ``mpipe.recompute``, or MindFormers'
    ``recompute_config.recompute``; both given and on: refused (one place)."""
    ours = ("mpipe.recompute", mp["recompute"]) if mp.get("recompute") is not None else None
    theirs = schema.value_at(raw, mf.RECOMPUTE_KEY)
    if ours is not None and theirs not in (None, False):
        raise SpecError("mpipe.recompute", f"{ours[1]!r} and {mf.RECOMPUTE_KEY}: {theirs!r} both given; give one")
    if ours is not None:
        return ours
    return None if theirs is None else (mf.RECOMPUTE_KEY, theirs)


def _memory_limit(mp: dict) -> Optional[float]:
    """``mpipe.memory_limit_gb``: a positive number of GB, or None when not given."""
    v = mp.get("memory_limit_gb")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise SpecError(MEMORY_FIELD, f"must be a positive number of GB per device, got {v!r}")
    return float(v)


def _set_trainable(prof: dict, raw: dict, enc: dict, hand_written: bool) -> dict:
    """``trainable`` of the regions from ``model.model_config.freeze_*`` flags and
    ``mpipe.encoder.trainable`` (every region before the pipelined one); a flag that contradicts
    the other or a hand-written region's ``trainable`` is refused. A flag for a part that is no
    region of the profile (e.g. ``freeze_projector``: the projector has no layer count, it is the
    tail of the encoder region before it) changes nothing."""
    if not isinstance(prof, dict) or not isinstance(prof.get("regions"), list):
        return prof   # parse_profile reports it
    regs = [dict(r) if isinstance(r, dict) else r for r in prof["regions"]]
    flags = mf.freeze_flags(_model_config(raw))
    for i, r in enumerate(regs):
        if not isinstance(r, dict):
            continue
        if isinstance(r.get("name"), str) and r["name"] in flags:
            frozen, key = flags[r["name"]]
            if "trainable" in enc and i < len(regs) - 1 and enc["trainable"] == frozen:
                raise SpecError(key, f"{frozen} contradicts mpipe.encoder.trainable: {enc['trainable']}; give it "
                                     "in one place")
            if hand_written and "trainable" in r and r["trainable"] == frozen:
                raise SpecError(key, f"{frozen} contradicts mpipe.profile.regions[{i}].trainable: "
                                     f"{r['trainable']}; give it in one place")
            r["trainable"] = not frozen
        if "trainable" in enc and i < len(regs) - 1:
            r["trainable"] = enc["trainable"]
    return dict(prof, regions=regs)


def _with_tied_embeddings(profile: ModelProfile, raw: dict) -> ModelProfile:
    """The profile with the language model's tied embedding and LM head (``tie_word_embeddings: true``) as a
    tied weight of its last region, on its first and last layer (the chunks holding the embedding and the head),
    sized vocabulary x hidden; a profile that lists it already (``mpipe.profile.tied``) is kept as it is."""
    tie = mf.tied_word_embeddings(raw)
    if tie is None or any(t.name == mf.WORD_EMBEDDINGS for t in profile.tied):
        return profile
    _, vocab, hidden = tie
    body = profile.regions[-1]
    nbytes = estimate.param_bytes(_model_config(raw))
    tied = TiedWeight(mf.WORD_EMBEDDINGS, body.name, tuple(sorted({0, body.layers - 1})),
                      vocab * hidden * nbytes / 2 ** 20)
    return replace(profile, tied=profile.tied + (tied,))


def _schedule_spec(raw: dict, mp: dict, P: int, V: int, M: int, v_key: str):
    """The recipe's schedule spec: ``mpipe.schedule``, else MindFormers' scheduler keys, else 1f1b."""
    if "schedule" in mp:
        return mp["schedule"]
    if mf.pipeline_interleave(raw) is not None:
        return mf.order_from_keys(raw, P, V, M, v_key)
    return "1f1b"


def _layout(raw: dict, profile: ModelProfile, P: int, V: int) -> Optional[dict]:
    """MindFormers' layer layout of the pipelined region, validated now (None: not a MindFormers config)."""
    if not mf.is_mindformers_config(raw):
        return None
    mc = _model_config(raw)
    body = profile.regions[-1]
    ts = mf.towers(mc)
    llm = ts[-1] if ts else None
    offset, key = mc.get("offset"), "model.model_config.offset"
    if llm is not None:
        counted = llm.key + (" + mtp_depth" if llm.config.get("mtp_depth") else "")
        if llm.layers != body.layers:
            raise SpecError(f"mpipe.profile.regions[{len(profile.regions) - 1}].layers",
                            f"{body.layers} differs from {counted} ({llm.layers}); give the same layer count")
        if llm.config is not mc and "offset" in llm.config:
            offset, key = llm.config["offset"], llm.key.rsplit(".", 1)[0] + ".offset"
        if llm.layers < P * V:
            raise SpecError(llm.key, f"{llm.layers} layers cannot be cut into pipeline_stage x pp_interleave_num "
                                     f"= {P} x {V} = {P * V} chunks")
    return {"num_layers": body.layers, "offset": offset, "key": key}


def device_of(raw: dict) -> str:
    """The recipe's ``device``, else MindFormers' ``context.device_target``, else CPU; checked."""
    ctx = raw.get("context") if isinstance(raw.get("context"), dict) else {}
    if "device" not in raw and ctx.get("device_target") in DEVICES:
        return ctx["device_target"]
    device = raw.get("device", "CPU")
    if device not in DEVICES:
        raise SpecError("device", f"{device!r} unknown; allowed: {', '.join(DEVICES)}")
    return device


def recipe_from_dict(raw: dict, path: Optional[str] = None, overrides: Iterable[str] = (),
                     cls: type = Recipe) -> Recipe:
    """The checked recipe of a raw dict (``--set`` overrides applied first). ``cls``: the class to build, a
    :class:`Recipe` (default) or a subclass (:class:`hyperparallel.runconfig.ParsedRecipe`, which adds the run
    config)."""
    overrides = list(overrides or ())
    for item in overrides:
        apply_override(raw, item)
    schema.check_keys(raw)   # an unknown key (in the file or through --set): refused, the nearest named
    train, train_note = _training_refusal(raw)
    P, M, V, D, v_key, v_note = _parallel(raw)
    T = tensor_parallel_of(raw)
    mp, enc = _mpipe(raw)
    prof = mp.get("profile")
    hand_written = prof is not None
    costs = "mpipe.profile"
    if prof is None:
        prof, costs = _profile_from_model_config(raw)
        if prof is None:
            raise SpecError("mpipe.profile", "missing; give the regions with their per-layer costs (or "
                                             "model.model_config.num_hidden_layers for a unit-cost profile)")
    profile = _with_tied_embeddings(parse_profile(_set_trainable(prof, raw, enc, hand_written)), raw)
    bounds.check_plan_size(P, V, M, len(profile.regions))
    spec = _schedule_spec(raw, mp, P, V, M, v_key)
    device = device_of(raw)
    recipe = cls(path=path, raw=raw, pipeline_stage=P, micro_batch_num=M, pp_interleave_num=V,
                 data_parallel=D, profile=profile, schedule=spec, device=device, overrides=overrides,
                 encoder=enc, v_key=v_key, layout=_layout(raw, profile, P, V), costs=costs,
                 memory_limit_gb=_memory_limit(mp), v_note=v_note, zero=_zero(raw, D),
                 notes=tuple(n for n in (schema.other_release_note(raw), parallel_defaults_note(raw),
                                         zero_note(raw, D), train_note) if n),
                 recompute=_recompute(raw, mp), tensor_parallel=T, train_parsed=train)
    recipe.recompute_spec("")   # a bad value, or a recompute of a model without backward: refused now
    if recipe.layout is not None:
        # refuse a bad offset now, whatever schedule is derived later
        recipe.chunk_layers(spec if spec == "zbv" else "")
    if "schedule" in mp and isinstance(spec, (str, list)):   # transpose options given twice must agree
        parse_schedule(spec, profile, "mpipe.schedule", V, recipe.transpose_defaults, "mpipe.encoder")
    return recipe


#: MindFormers' training sections: a value the runtime cannot train with is ``train``'s to refuse; ``plan``,
#: ``check`` and ``simulate`` read the layout and name it (hyperparallel's own ``train:`` stays checked here)
MINDFORMERS_TRAINING = ("optimizer", "lr_schedule", "runner_wrapper", "calculate_per_token_loss")


def _training_refusal(raw: dict) -> Tuple[object, str]:
    """(the training settings, the note) read as ``train`` reads them: (TrainConfig, '') when they train, else
    (the SpecError, the note naming the MindFormers value, or unknown key, ``train`` refuses: public configs of
    other releases carry some, e.g. ``optimizer.beta1`` for AdamW); any refusal in hyperparallel's own
    ``train:`` section is raised at once."""
    try:
        return TrainConfig.from_raw(raw), ""
    except SpecError as e:
        if e.field.split(".")[0] not in MINDFORMERS_TRAINING:
            raise
        return e, f"note: {e} (train refuses it; the plan does not read it)"


def _zero(raw: dict, D: int) -> int:
    """The ZeRO level (``train.zero`` or ``parallel_config.optimizer_shard``), refused naming its key when
    there is a single data-parallel replica to shard over. MindFormers' ``optimizer_shard: true`` with one
    replica (public configs carry it; MindSpore shards over nothing) plans as level 0, named in a note
    (:func:`zero_note`); ``train`` refuses it (``schema.train_refusals``)."""
    level, key = zero_of(raw)
    if _shard_over_one(raw, key, D):
        return 0
    return check_zero(level, D, key) if key != "default" else 0


def _shard_over_one(raw: dict, key: str, D: int) -> bool:
    own = raw.get("train") if isinstance(raw.get("train"), dict) else {}
    return key == "parallel_config.optimizer_shard" and D < 2 and "zero" not in own


def zero_note(raw: dict, D: int) -> str:
    """The plan's note for MindFormers' ``optimizer_shard: true`` over a single replica."""
    level, key = zero_of(raw)
    if not _shard_over_one(raw, key, D):
        return ""
    try:
        check_zero(level, D, key)
    except SpecError as e:
        return f"note: {e} (train refuses it; the plan holds the whole optimizer state)"
    return ""


def load_recipe(path: str, overrides: Iterable[str] = ()) -> Recipe:
    """Load, merge ``base_config`` parents, apply ``--set`` overrides, validate."""
    return recipe_from_dict(load_raw(path), path=path, overrides=overrides)


# -- recipe -> checked plan: the one load -> derive -> check chain every command and tool uses --------

def derive_recipe(recipe: Recipe, schedule=None) -> Plan:
    """The recipe's plan (unchecked), with an optional schedule override (short name or list form)."""
    plan = derive(recipe.profile, recipe.plan_schedule(schedule), recipe.pipeline_stage, recipe.micro_batch_num,
                  recipe.pp_interleave_num, recipe.data_parallel, recipe.zero)
    plan.meta["recipe"] = recipe.path
    if recipe.tensor_parallel > 1:
        plan.meta["tensor_parallel"] = recipe.tensor_parallel
    if recipe.zero:   # the level, the key that gave it and the line plan and train print
        level, key = zero_of(recipe.raw)
        plan.meta["zero"] = {"level": level, "key": key, "line": zero_line(level, key, recipe.data_parallel)}
    return plan


def checked_plan(recipe: Recipe, schedule=None) -> Plan:
    """The recipe's plan, checked (PlanError on a checker finding)."""
    return assert_valid(derive_recipe(recipe, schedule))

