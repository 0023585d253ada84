"""A MindFormers YAML resolves in hyperparallel as MindFormers 1.9.0 resolves it (issue 40, section 2b).

Each config is read twice: by MindFormers' own ``MindFormerConfig`` (which applies its config template,
``mindformers/tools/register/template.py``) and by hyperparallel (``load_recipe`` + ``TrainConfig``); the
optimizer, learning-rate schedule, learning rate, seed, loss normalization, clipping and batch values
they resolve must agree. What MindFormers' trainer does after loading is applied on its side as the
trainer does it: the ``lr_schedule`` replaces ``optimizer.learning_rate``, pipeline stages swap the
wrapper for ``MFPipelineWithLossScaleCell``, ``pipeline_stage: 1`` resets ``micro_batch_num`` to 1.
Fast (no msrun): MindFormers is imported, nothing is built.
"""
import inspect
import os

import pytest

from helpers import ROOT
from hyperparallel.errors import SpecError
from hyperparallel.recipe import load_recipe
from hyperparallel.recipe import recipe as recipe_reader
from hyperparallel.recipe.train import TrainConfig
from hyperparallel.runconfig import load_parsed

CONFIGS = [os.path.join("tests", "data", "mindformers", n) for n in
           ("llama_defaults.yaml", "llama_sgd_per_token.yaml", "qwen2_vl_7b_freeze_vision.yaml")] + \
          [os.path.join("recipes", "mindformers", n) for n in ("qwen2_5_vl_7b.yaml", "qwen2_5_vl_72b.yaml")] + \
          [os.path.join("recipes", "mf_llama_adamw.yaml")]


@pytest.fixture(scope="module")
def mindformers_reading():
    """path -> MindFormers' own MindFormerConfig of that YAML (template applied)."""
    from mindformers.tools.register.config import MindFormerConfig
    return lambda path: MindFormerConfig(os.path.join(ROOT, path))


def _wrapper_default(cls_name: str, arg: str):
    """The default of ``arg`` in MindFormers' wrapper class ``cls_name`` (its own signature)."""
    import mindformers.wrapper as w
    return inspect.signature(getattr(w, cls_name).__init__).parameters[arg].default


def _mindformers_resolved(cfg) -> dict:
    """What MindFormers' trainer trains with, from its loaded config."""
    pc, rw, sched, opt = cfg.parallel_config, cfg.runner_wrapper, cfg.lr_schedule, cfg.optimizer
    pp = pc.pipeline_stage
    wrapper = "MFPipelineWithLossScaleCell" if pp > 1 else rw.type   # BaseTrainer._reset_wrapper_for_pipeline_parallel
    use_clip = rw.get("use_clip_grad")
    if use_clip is None:
        use_clip = _wrapper_default(wrapper, "use_clip_grad")
    norm = rw.get("max_grad_norm") if rw.get("max_grad_norm") is not None else _wrapper_default(wrapper,
                                                                                                 "max_grad_norm")
    return {
        "optimizer": opt.type,
        "optimizer_fields": {k: tuple(v) if isinstance(v, list) else v for k, v in opt.items()
                             if k not in ("type", "learning_rate")},
        "schedule": sched.type if sched else None,
        "schedule_fields": {k: v for k, v in sched.items() if k not in ("type", "learning_rate")} if sched else {},
        "learning_rate": sched.learning_rate if sched else opt.learning_rate,   # build_optim: the schedule wins
        "seed": cfg.seed,
        "loss_normalization": "tokens" if cfg.get("calculate_per_token_loss") else "micro_batch",
        "max_grad_norm": float(norm) if use_clip else None,
        "batch_size": cfg.runner_config.batch_size,
        "pipeline_stage": pp,
        "micro_batch_num": pc.micro_batch_num if pp > 1 else 1,   # _check_global_batch_size_for_auto_parallel
        "data_parallel": pc.data_parallel,
    }


def _micro_batch_size(recipe) -> int:
    """Sequences per micro-batch as the runtime reads them (the recipe's ``run``), or, for a config the CPU
    runtime refuses to train (tensor parallelism, Ascend), as the recipe reader fills it."""
    try:
        return recipe.run.data.micro_batch_size
    except SpecError:
        return recipe_reader._batch(recipe.raw)


def _hyperparallel_resolved(path: str) -> dict:
    recipe = load_parsed(os.path.join(ROOT, path))
    t = recipe.train
    return {
        "optimizer": t.opt.type,
        "optimizer_fields": dict(t.opt.kwargs),
        "schedule": t.schedule.type,
        "schedule_fields": dict(t.schedule.kwargs),
        "learning_rate": t.schedule.learning_rate,
        "seed": t.seed,
        "loss_normalization": t.loss_normalization,
        "max_grad_norm": t.max_grad_norm,
        "batch_size": _micro_batch_size(recipe),
        "pipeline_stage": recipe.pipeline_stage,
        "micro_batch_num": recipe.micro_batch_num,
        "data_parallel": recipe.data_parallel,
    }


@pytest.mark.parametrize("path", CONFIGS)
def test_training_settings_resolve_as_mindformers_resolves_them(mindformers_reading, path):
    assert _hyperparallel_resolved(path) == _mindformers_resolved(mindformers_reading(path))


def test_the_configs_cover_the_template_defaults(mindformers_reading):
    """The comparison above exercises each default hyperparallel fills: an absent optimizer and lr_schedule,
    an optimizer without lr_schedule, no seed, the per-token loss, a wrapper without use_clip_grad."""
    raw = {p: load_recipe(os.path.join(ROOT, p)).raw for p in CONFIGS}
    assert any("optimizer" not in r and "lr_schedule" not in r and "seed" not in r for r in raw.values())
    assert any("optimizer" in r and "lr_schedule" not in r for r in raw.values())
    assert any(r.get("calculate_per_token_loss") is True for r in raw.values())
    assert any(isinstance(r.get("runner_wrapper"), dict) and "use_clip_grad" not in r["runner_wrapper"]
               and r["parallel_config"]["pipeline_stage"] == 1 for r in raw.values())
    defaults = _mindformers_resolved(mindformers_reading(CONFIGS[0]))
    assert (defaults["optimizer"], defaults["schedule"], defaults["learning_rate"], defaults["seed"]) == \
        ("AdamW", "CosineWithWarmUpLR", 5e-5, 1)


def test_stop_step_does_not_squeeze_the_schedule():
    """``runner_config.stop_step`` ends a MindFormers run early; the ``total_steps: -1`` schedule still spans
    ``epochs`` x the data set's steps, as MindFormers' ``create_lr_scheduler`` sizes it."""
    from hyperparallel.commands.train import run_steps, schedule_steps
    raw = load_recipe(os.path.join(ROOT, "recipes", "mf_llama_adamw.yaml"),
                      ["runner_config.stop_step=2", "runner_config.epochs=3"]).raw
    t = TrainConfig.from_raw(raw)
    steps, key = run_steps(None, raw, t, 100, 8)   # 100 usable samples, 8 a step: 12 steps an epoch
    assert (steps, key) == (2, "runner_config.stop_step")
    assert schedule_steps(raw, t, 100, steps, key, 8) == 36
    assert "total_steps 36" in t.describe(36)
    # without stop_step, or with the project's own train: recipe, the schedule spans the run
    assert schedule_steps(raw, t, 100, 36, "runner_config.epochs: 3 x 12 steps", 8) == 36
    with pytest.raises(SpecError) as e:   # generated data has no epochs to size it by
        schedule_steps(raw, t, None, 2, "runner_config.stop_step", 8)
    assert str(e.value).startswith("lr_schedule.total_steps: -1 with runner_config.stop_step: MindFormers sizes")


@pytest.mark.parametrize("position,epoch_num", [({"epoch": 1, "index": 8, "num_samples": 96}, 2),
                                                ({"epoch": 2, "index": 0, "num_samples": 96}, 2), (None, None)])
def test_merged_checkpoint_with_optimizer_carries_mindformers_resume_values(tmp_path, position, epoch_num):
    """``ckpt --merge --with-optimizer`` writes ``step_num``, ``loss_scale`` and (with a data position)
    ``epoch_num``, the names MindFormers' resume (``load_resume_context_from_checkpoint``) reads; without
    ``--with-optimizer`` only the parameters."""
    import mindspore as ms
    import numpy as np
    from hyperparallel.runtime.checkpoint import merge
    from hyperparallel.runtime.ckpt_files import Source
    f = str(tmp_path / "rank_0.safetensors")
    ms.save_checkpoint([{"name": "layer.w", "data": ms.Tensor(np.ones((2, 2), np.float32))}], f, format="safetensors")
    src = Source(str(tmp_path), [f], 20, {"data_position": position} if position else {})
    merge(src, str(tmp_path / "full.ckpt"), True)
    got = ms.load_checkpoint(str(tmp_path / "full.ckpt"))
    assert int(got["step_num"].asnumpy()) == 20 and float(got["loss_scale"].asnumpy()) == 1.0
    assert (int(got["epoch_num"].asnumpy()) if "epoch_num" in got else None) == epoch_num
    merge(src, str(tmp_path / "params.ckpt"))
    assert set(ms.load_checkpoint(str(tmp_path / "params.ckpt"))) == {"layer.w"}
