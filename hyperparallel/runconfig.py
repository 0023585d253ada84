"""A run's configuration: the recipe's model adapter, data config and ``train:`` settings, and the one parsed
recipe object every front end and every rank reads (:class:`ParsedRecipe`).

Pure Python (no MindSpore): the launcher checks these before starting msrun. The model is an
adapter (:mod:`hyperparallel.models`): it owns the region names and depths; the recipe's cost
profile, where it gives layer counts, must agree with them.

The recipe is parsed once, by :func:`parse_recipe` (a raw dict: a rank's job case) or :func:`load_parsed`
(a file with ``--set`` overrides: the front ends): a :class:`ParsedRecipe` is the plan's
:class:`~hyperparallel.recipe.Recipe` (P, M, V, D, profile, schedule), its ``train`` settings (parsed with
it) and, on first use, its checked ``run`` config (built once, cached).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Iterable, Optional, Sequence

from .data import DataSection, DataSource, data_config, data_source
from .models import ModelAdapter, adapter_for, families
from .errors import SpecError
from .recipe import schema
from .recipe.files import load_raw
from .recipe.recipe import Recipe, compile_settings, device_of, recipe_from_dict
from .recipe.train import TrainConfig, one_micro_batch_without_pipeline


@dataclass(frozen=True)
class RunConfig:
    model: ModelAdapter
    data: DataSection   # the data.type's config (hyperparallel.data.TYPES)
    train: TrainConfig
    device: str = "CPU"
    compile: str = "jit"              # mpipe.compile: jit | eager
    compile_fallback: str = "error"   # mpipe.compile_fallback: error | eager

    @staticmethod
    def from_raw(raw: dict, train: Optional[Callable[[], TrainConfig]] = None) -> "RunConfig":
        """The run config of a raw recipe (unchecked against its profile: :attr:`ParsedRecipe.run` is the checked
        one). ``train``: gives the recipe's parsed training settings (:attr:`Recipe.train`, which raises its
        refusal at the point this parse would), instead of parsing them again."""
        device = device_of(raw)
        schema.check_trainable(raw, device)   # a MindFormers value the runtime cannot train with: refused
        pc = raw.get("parallel_config") if isinstance(raw.get("parallel_config"), dict) else {}
        # training only (plan reads the config as given): MindFormers trains one micro-batch with one stage
        one_micro_batch_without_pipeline(raw, pc.get("pipeline_stage", 1), pc.get("micro_batch_num", 1))
        train = TrainConfig.from_raw(raw) if train is None else train()
        families()   # every family's data layouts are registered before the data section is read
        data = data_config(_with_batch_size(raw))
        schema.check_batch_size(raw, data.micro_batch_size)
        model = adapter_for(raw.get("model"), data.shapes(), train.seed)
        model.check_device(device)
        from .recipe.recipe import tensor_parallel_of
        model.check_tensor_parallel(tensor_parallel_of(raw))
        check_precision(model, train)
        data.check_model(model)   # the data section can lay out micro-batches the way this model reads them
        mode, fallback = compile_settings(raw)
        if data.balance == "encoder" and train.loss_normalization != "tokens":
            where = dict(train.keys).get("loss", "train.loss_normalization")
            raise SpecError("data.balance", f"encoder needs train.loss_normalization: tokens (or MindFormers' "
                                            f"calculate_per_token_loss: true; with {train.loss_normalization}, from "
                                            f"{where}, the loss depends on how the step's samples are grouped into "
                                            "micro-batches)")
        return RunConfig(model=model, data=data, train=train, device=device, compile=mode,
                         compile_fallback=fallback)

    def source(self) -> DataSource:
        """A fresh data source of this run (every rank, the reference and the bench build their own)."""
        return data_source(self.data, self.train.seed, self.model.data_format)

    def check_plan(self, plan) -> None:
        """What the data settings need from the plan, before launch (``data.balance: encoder``: owners)."""
        from .data.balance import check_plan
        check_plan(plan, self.data.balance)
        self.model.check_trainable(dict(plan.trainable))   # e.g. model.lora on a region the plan freezes


def check_precision(model: ModelAdapter, train: TrainConfig) -> None:
    """float16 compute needs a loss scale (its gradients underflow without one): refused before launch,
    naming the key to give and the values it takes."""
    dtype, key = model.precision()
    if dtype == "float16" and train.loss_scale is None:
        raise SpecError("runner_wrapper.scale_sense",
                        f"none, but {key} is float16, whose gradients underflow without a loss scale; give a number "
                        "> 1 (static) or {type: DynamicLossScaleUpdateCell, loss_scale_value: 65536, scale_factor: 2, "
                        "scale_window: 1000} (or FixedLossScaleUpdateCell), or " f"{key}: float32")


def _with_batch_size(raw: dict) -> dict:
    """The recipe with ``data.micro_batch_size`` taken from MindFormers' batch-size key when the data
    section leaves it out (``runner_config.batch_size`` is the sequences of one micro-batch)."""
    found = schema.batch_size_keys(raw)
    data = raw.get("data")
    if not found or (isinstance(data, dict) and "micro_batch_size" in data) or (data is not None and
                                                                                not isinstance(data, dict)):
        return raw
    return dict(raw, data=dict(data or {}, micro_batch_size=found[0][1]))


def check_regions(model: ModelAdapter, regions: Sequence, where: str = "mpipe.profile.regions") -> None:
    """The profile's (or plan's) regions must be the model's, in order, with the model's depths.

    ``regions``: objects with ``name`` and ``layers`` (profile regions). SpecError names both keys."""
    names = [r.name for r in regions]
    want = model.regions()
    if names != [r.name for r in want]:
        raise SpecError(where, f"regions {names} but the {model.family} model has "
                               f"{[r.name for r in want]} (in data-flow order)")
    for i, (got, w) in enumerate(zip(regions, want)):
        if got.layers is not None and int(got.layers) != w.layers:
            raise SpecError(f"{where}[{i}].layers", f"{got.layers} but {w.key or 'the model'} is {w.layers} "
                                                    f"(the model owns its depth; the profile gives costs only)")


class ParsedRecipe(Recipe):
    """The recipe as every front end and every rank reads it, parsed once: the plan's :class:`Recipe`, its
    ``train`` settings and its ``run`` config (model adapter, data, train, device, compile settings), built on
    first use (plan, check and simulate never build it: a model ``train`` refuses is planned as given)."""

    @cached_property
    def run(self) -> RunConfig:
        """The run config, checked before launch (its regions and tied weights the profile's): a bad value is a
        one-line SpecError (raised again on every read; a good one is built once)."""
        try:
            rc = RunConfig.from_raw(self.raw, lambda: self.train)
        except TypeError as e:   # a section's value of the wrong type, e.g. train: {steps: [1]}
            raise SpecError("recipe", str(e).splitlines()[0]) from None
        check_regions(rc.model, self.profile.regions)
        check_tied(rc.model, self.profile.tied)
        return rc


def parse_recipe(raw: dict, path: Optional[str] = None, overrides: Iterable[str] = ()) -> ParsedRecipe:
    """The one parse of a recipe: a raw dict (``--set`` overrides applied first), as the front ends load it and
    every rank receives it (its job case's ``raw``)."""
    return recipe_from_dict(raw, path=path, overrides=overrides, cls=ParsedRecipe)


def load_parsed(path: str, overrides: Iterable[str] = ()) -> ParsedRecipe:
    """The recipe file ``path`` (``base_config`` parents merged, ``--set`` overrides applied), parsed once."""
    return parse_recipe(load_raw(path), path=path, overrides=overrides)


def check_tied(model: ModelAdapter, tied: Sequence) -> None:
    """The model's tied weights (its adapter's ``tied_weights()``) are the profile's (``mpipe.profile.tied``,
    or the recipe's ``tie_word_embeddings``), so the plan sums every tied weight's copies: a mismatch would
    train the copies apart, silently; refused before launch."""
    have, want = sorted(model.tied_weights()), sorted(t.name for t in tied)
    if have != want:
        raise SpecError("mpipe.profile.tied", f"the plan ties {want or 'nothing'} but the {model.family} model ties "
                                              f"{have or 'nothing'}; set tie_word_embeddings in the language model's "
                                              f"own config section (e.g. model.model_config.text_config)")
