"""Recipe keys: MindFormers' own key lists and signatures (conformance, in a subprocess), unknown keys
refused everywhere with the nearest key, training settings honoured or refused before launch, batch
sizes checked against the data."""
import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT, recipe, run_main
from hyperparallel.errors import SpecError
from hyperparallel.recipe import load_recipe, schema
from hyperparallel.recipe.train import LR_FIELDS, OPTIMIZER_FIELDS, TrainConfig
from hyperparallel.runconfig import RunConfig

MF = recipe("mf_llama_adamw.yaml")   # MindFormers' training sections, no train: section
TINY = recipe("tiny_mllm.yaml")

# what the installed MindFormers / MindSpore say: template classes and the classes' signatures
_PROBE = r"""
import inspect, json
from mindformers.tools.register import template as t
import mindformers.core.lr as L, mindformers.core.optim as O, mindspore.nn as nn
out = {"sections": sorted(k for k in t.CONFIG_NAME_TO_CLASS if k != "general_config"),
       "general": t.GeneralConfig.keys(),
       "strict": {k: t.CONFIG_NAME_TO_CLASS[k].keys() for k in
                  ("parallel_config", "recompute_config", "swap_config", "runner_config", "monitor_config",
                   "runner_wrapper")}}
def params(f):
    return [p for p in inspect.signature(f).parameters if p not in ("self", "cls", "params", "kwargs", "args")]
def wrapped(init):   # MindSpore's optimizers register their init arguments through a decorator
    inner = [c.cell_contents for c in (init.__closure__ or []) if inspect.isfunction(c.cell_contents)]
    return inner[0] if inner else init
out["optim"] = {"AdamW": params(O.AdamW.__new__), "Adam": params(wrapped(nn.Adam.__init__)),
                "SGD": params(wrapped(nn.SGD.__init__))}
out["lr"] = {n: params(getattr(L, n).__init__) for n in %s}
print("PROBE" + json.dumps(out))
""" % (list(LR_FIELDS),)


@pytest.fixture(scope="module")
def mindformers_keys():
    p = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("PROBE")][0]
    return json.loads(line[len("PROBE"):])


@pytest.mark.slow
def test_key_lists_are_mindformers_template(mindformers_keys):
    k = mindformers_keys
    assert sorted(schema.SECTIONS) == k["sections"]
    extra = {"calculate_per_token_loss", "use_skip_data_by_global_norm", "grouped_lr_schedule"}   # read outside it
    assert set(schema.GENERAL) == set(k["general"]) | extra and not extra & set(k["general"])
    for sec, keys in k["strict"].items():
        ours = set(schema.STRICT[sec])
        assert set(keys) <= ours, (sec, set(keys) - ours)   # every template key known
    assert set(schema.STRICT["parallel_config"]) - set(k["strict"]["parallel_config"]) == {"pp_interleave_num"}
    # runner_wrapper: the template's plus the train-one-step cells' own keyword arguments
    assert set(schema.STRICT["runner_wrapper"]) - set(k["strict"]["runner_wrapper"]) == {
        "max_grad_norm", "local_norm", "calculate_per_token_loss", "use_skip_data_by_global_norm",
        "global_norm_spike_threshold"}


def test_optimizer_and_lr_fields_are_the_classes_signatures(mindformers_keys):
    for t, fields in OPTIMIZER_FIELDS.items():
        assert list(fields) == mindformers_keys["optim"][t], t
    for t, fields in LR_FIELDS.items():
        assert list(fields) == mindformers_keys["lr"][t], t


# -- unknown keys -----------------------------------------------------------------------------------

@pytest.mark.parametrize("sets,words", [
    (["parallel_config.pipline_stage=4"], ["parallel_config.pipline_stage: unknown key", "did you mean "
                                                                                     "'pipeline_stage'?"]),
    (["runner_config.batchsize=2"], ["runner_config.batchsize: unknown key", "did you mean 'batch_size'?"]),
    (["sed=3"], ["sed: unknown key at the top level of the recipe", "did you mean 'seed'?",
                 "listed in docs/mindformers.md ('Recipe keys')"]),
    (["runner_wrapper.max_grad_nrm=1"], ["runner_wrapper.max_grad_nrm: unknown key", "'max_grad_norm'"]),
    (["train.step=3"], ["train.step: unknown key", "did you mean 'steps'?"]),
    (["mpipe.schedul=1f1b"], ["mpipe.schedul: unknown key", "did you mean 'schedule'?"]),
])
def test_unknown_keys_refused_with_the_nearest_key(sets, words, tmp_path):
    p = run_main("plan", MF, *[f"--set={s}" for s in sets])
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("sets,words", [
    (["optimizer.type=AdamW", "optimizer.weight_decy=0.1"], "optimizer.weight_decy: unknown key for AdamW; "),
    (["optimizer.type=AdamW", "optimizer.beta1=0.9"], "optimizer.beta1: unknown key for AdamW; "),
    (["lr_schedule.type=CosineWithWarmUpLR", "lr_schedule.learning_rate=0.1", "lr_schedule.warmup_ratoi=0.1"],
     "lr_schedule.warmup_ratoi: unknown key for CosineWithWarmUpLR; "),
])
def test_unknown_keys_of_mindformers_training_sections_plan_with_a_note_and_train_refuses(sets, words, tmp_path):
    """The plan reads no optimizer or LR key, so one MindFormers would reject (a public config of another
    release writes ``optimizer.beta1`` for AdamW) is named in a note; ``train`` refuses it before launch."""
    sets = [f"--set={s}" for s in sets]
    p = run_main("plan", MF, *sets)
    assert p.returncode == 0, p.stderr
    note = [ln for ln in p.stdout.splitlines() if ln.startswith("note: " + words)]
    assert len(note) == 1 and "did you mean" in note[0] and note[0].endswith(
        "(train refuses it; the plan does not read it)"), p.stdout
    p = run_main("train", MF, *sets, "--steps", "1", "--run-dir", str(tmp_path / "run"))
    assert p.returncode == 2 and p.stderr.startswith("error: " + words), p.stderr
    assert not (tmp_path / "run" / "logs").exists()


def test_train_refuses_unknown_keys_before_launch(tmp_path):
    p = run_main("train", MF, "--set", "parallel_config.pipline_stage=4", "--run-dir", str(tmp_path / "run"))
    assert p.returncode == 2 and p.stderr.startswith("error: parallel_config.pipline_stage: unknown key"), p.stderr
    assert "did you mean 'pipeline_stage'?" in p.stderr and not (tmp_path / "run" / "logs").exists()


def test_unknown_key_message_lists_short_allowed_sets_in_order():
    with pytest.raises(SpecError) as e:
        schema.check_keys({"runner_config": {"epoch": 1}})
    assert str(e.value) == ("runner_config.epoch: unknown key; allowed: batch_size, epochs, sink_mode, sink_size, "
                            "gradient_accumulation_steps, num_classes, stop_step; did you mean 'epochs'?")


# -- training settings: honoured -------------------------------------------------------------------

def _raw(**sections):
    raw = load_recipe(MF).raw
    for k in ("seed", "optimizer", "lr_schedule", "runner_wrapper", "runner_config"):
        raw.pop(k)
    raw.update(sections)
    return raw


def test_mindformers_sections_honoured():
    cfg = TrainConfig.from_raw(_raw(
        seed=42, optimizer={"type": "AdamW", "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
        lr_schedule={"type": "CosineWithWarmUpLR", "learning_rate": 1e-3, "warmup_ratio": 0.1, "total_steps": -1},
        runner_wrapper={"type": "MFTrainOneStepCell", "use_clip_grad": True, "max_grad_norm": 0.5}))
    assert cfg.seed == 42 and cfg.opt.type == "AdamW" and cfg.opt.grouped
    assert dict(cfg.opt.kwargs) == {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    assert cfg.schedule.type == "CosineWithWarmUpLR" and cfg.max_grad_norm == 0.5
    assert cfg.schedule.fields_for(20)["total_steps"] == 20   # -1: the run's steps
    assert cfg.describe(20) == ("optimizer AdamW (betas=(0.9, 0.95), eps=1e-08, weight_decay=0.1), "
                               "CosineWithWarmUpLR (MindFormers) lr 0.001, 2 warm-up steps, total_steps 20, "
                               "clip grad norm 0.5 (runner_wrapper), seed 42 (seed), loss mean of micro-batch means")


def test_mindformers_defaults_when_sections_are_partial():
    # MindFormers' template: an optimizer section alone still gets its default lr_schedule (CosineWithWarmUpLR
    # from 5e-5 to 0, total_steps -1), seed 1, clipping at 1.0, the mean of the micro-batch means
    cfg = TrainConfig.from_raw(_raw(optimizer={"type": "SGD", "momentum": 0.5}))
    assert (cfg.seed, dict(cfg.keys)["seed"]) == (1, "MindFormers' default")
    assert cfg.schedule.type == "CosineWithWarmUpLR" and cfg.schedule.learning_rate == 5e-5
    assert cfg.schedule.fields_for(7) == {"learning_rate": 5e-5, "lr_end": 0.0, "warmup_ratio": 0.0, "total_steps": 7}
    assert cfg.max_grad_norm == 1.0 and cfg.loss_normalization == "micro_batch"
    # neither section: AdamW (betas 0.9/0.999, eps 1e-8, no weight decay) on that schedule
    cfg = TrainConfig.from_raw(_raw())
    assert (cfg.opt.type, dict(cfg.opt.kwargs)) == ("AdamW", {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0})
    assert (cfg.schedule.type, cfg.schedule.learning_rate, cfg.seed) == ("CosineWithWarmUpLR", 5e-5, 1)
    # runner_wrapper without use_clip_grad: with pipeline stages MindFormers' MFPipelineWithLossScaleCell (on);
    # with pipeline_stage 1 MFTrainOneStepCell's default (off); use_clip_grad false: none
    assert TrainConfig.from_raw(_raw(runner_wrapper={"type": "MFTrainOneStepCell"})).max_grad_norm == 1.0
    one = {"data_parallel": 1, "pipeline_stage": 1, "micro_batch_num": 1}
    assert TrainConfig.from_raw(_raw(runner_wrapper={"type": "MFTrainOneStepCell"},
                                     parallel_config=one)).max_grad_norm is None
    assert TrainConfig.from_raw(_raw(runner_wrapper={"type": "MFPipelineWithLossScaleCell"},
                                     parallel_config=one)).max_grad_norm == 1.0
    assert TrainConfig.from_raw(_raw(runner_wrapper={"use_clip_grad": False})).max_grad_norm is None
    # calculate_per_token_loss: true is the mean over the step's answer tokens
    assert TrainConfig.from_raw(_raw(calculate_per_token_loss=True)).loss_normalization == "tokens"
    # the train: section alone: no clipping, Adam at its lr, seed as given (0 when absent), the token mean
    cfg = TrainConfig.from_raw({"train": {"lr": 0.02, "seed": 3}})
    assert (cfg.opt.type, cfg.schedule.learning_rate, cfg.max_grad_norm, cfg.seed) == ("Adam", 0.02, None, 3)
    cfg = TrainConfig.from_raw({"train": {}})
    assert (cfg.opt.type, cfg.schedule.learning_rate, cfg.seed, cfg.loss_normalization) == ("Adam", 0.01, 0, "tokens")
    # a MindFormers model with the project's train: optimizer keeps the project's defaults
    raw = _raw(train={"optimizer": "adam"})
    cfg = TrainConfig.from_raw(raw)
    assert (cfg.opt.type, cfg.seed, cfg.max_grad_norm, cfg.loss_normalization) == ("Adam", 0, None, "tokens")


@pytest.mark.parametrize("sections,key,words", [
    ({"seed": 1, "train": {"seed": 2}}, "train.seed", "contradicts the top-level seed 1"),
    ({"optimizer": {"type": "AdamW"}, "train": {"lr": 0.1}}, "train.lr", "give the optimizer and learning rate in "
                                                                          "one place"),
    ({"optimizer": {"type": "Lamb"}}, "optimizer.type", "allowed: AdamW, Adam, SGD"),
    ({"optimizer": {"type": "AdamW", "use_fused": True}}, "optimizer.use_fused", "BasicAdamW"),
    ({"optimizer": {"type": "AdamW", "betas": [0.9]}}, "optimizer.betas", "two numbers in [0, 1)"),
    ({"optimizer": {"type": "AdamW", "learning_rate": 0.1},
      "lr_schedule": {"type": "ConstantWarmUpLR", "learning_rate": 0.2}}, "optimizer.learning_rate",
     "contradicts lr_schedule.learning_rate"),
    ({"optimizer": {"type": "AdamW", "learning_rate": 1e-3}}, "optimizer.learning_rate",
     "not used by MindFormers without an lr_schedule: section (its template's CosineWithWarmUpLR from 5e-05"),
    ({"calculate_per_token_loss": True, "train": {"loss_normalization": "micro_batch"}}, "train.loss_normalization",
     "'micro_batch' contradicts calculate_per_token_loss true (tokens); give it in one place"),
    ({"calculate_per_token_loss": "yes"}, "calculate_per_token_loss", "must be true or false"),
    ({"lr_schedule": {"type": "CosineAnnealingLR", "learning_rate": 0.1}}, "lr_schedule.type",
     "allowed: ConstantWarmUpLR, LinearWithWarmUpLR, CosineWithWarmUpLR"),
    ({"lr_schedule": {"type": "ConstantWarmUpLR"}}, "lr_schedule.learning_rate", "missing"),
    ({"lr_schedule": {"type": "ConstantWarmUpLR", "learning_rate": 0.1, "warmup_ratio": 2}},
     "lr_schedule.warmup_ratio", "[0, 1]"),
    ({"runner_wrapper": {"max_grad_norm": 0}}, "runner_wrapper.max_grad_norm", "must be a number > 0"),
    ({"runner_wrapper": {"use_clip_grad": "yes"}}, "runner_wrapper.use_clip_grad", "true or false"),
    ({"train": {"optimizer_compile": "graph"}}, "train.optimizer_compile", "'graph' unknown; allowed: jit, eager"),
])
def test_training_settings_refused_naming_the_key(sections, key, words):
    with pytest.raises(SpecError) as e:
        TrainConfig.from_raw(_raw(**sections))
    assert str(e.value).startswith(key + ":") and words in str(e.value), str(e.value)


# -- what the runtime cannot do: refused for train, plan still works ------------------------------------

@pytest.mark.parametrize("override,words", [
    ("parallel_config.model_parallel=2", "parallel_config.model_parallel: 2: the mindformers LlamaForCausalLM model "
                                         "has no tensor-parallel layers; allowed: 1"),
    ("runner_wrapper.scale_sense=[1024]", "runner_wrapper.scale_sense: [1024]: give a number (a static scale"),
    ("runner_config.gradient_accumulation_steps=4", "raise parallel_config.micro_batch_num instead"),
    ("context.mode=0", "context.mode: 0: hyperparallel's runtime runs PyNative"),
    ("context.device_target=Ascend", "context.device_target: 'Ascend' differs from device: CPU"),
    ("run_mode=predict", "run_mode: 'predict': hyperparallel trains (allowed: train, finetune)"),
    ("load_checkpoint=/x.ckpt", "load_checkpoint: '/x.ckpt' is not read by hyperparallel's runtime; use "
                                "model.pretrained"),
    ("runner_wrapper.type=MyCell", "runner_wrapper.type: 'MyCell' unknown; allowed: MFTrainOneStepCell"),
    ("model.model_config.batch_size=1", "model.model_config.batch_size: 1 but data.micro_batch_size is 2"),
])
def test_what_the_runtime_cannot_do_is_refused_before_launch(override, words, tmp_path):
    p = run_main("train", MF, "--set", override, "--run-dir", str(tmp_path / "run"))
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], p.stderr
    assert not (tmp_path / "run" / "logs").exists()
    if not override.startswith("model."):
        assert load_recipe(MF, [override]).pipeline_stage == 2   # planning is unaffected


@pytest.mark.parametrize("key,value,words", [
    ("recompute_config.select_recompute", ["feed_forward\\.mul"], "recompute_config.select_recompute: ["),
    ("recompute_config.select_recompute", {"feed_forward\\.w1": [1, 1]}, "recompute_config.select_recompute: {"),
    ("recompute_config.select_comm_recompute", [2, 0], "recompute_config.select_comm_recompute: [2, 0]"),
    ("use_legacy", False, "use_legacy: False is not supported; give true or leave it out"),
    ("resume_training", "llama_rank_0-10_2.ckpt", "resume_training: 'llama_rank_0-10_2.ckpt' is not supported"),
    ("context.deterministic", "ON", "context.deterministic: 'ON' is not supported; give OFF"),
    ("parallel.strategy_ckpt_load_file", "./ckpt_strategy.ckpt", "parallel.strategy_ckpt_load_file: "
                                                                  "'./ckpt_strategy.ckpt' is not supported"),
])
def test_unhonoured_mindformers_values_are_refused_for_training_but_planned(key, value, words):
    """Accepted and neither honoured nor named before issue 40: refused by train/profile/bench (naming the key),
    while plan still reads the config."""
    raw = load_recipe(MF).raw
    sec, _, leaf = key.rpartition(".")
    (raw.setdefault(sec, {}) if sec else raw)[leaf] = value
    with pytest.raises(SpecError) as e:
        schema.check_trainable(raw, "CPU")
    assert str(e.value).startswith(words), str(e.value)
    from hyperparallel.recipe.recipe import recipe_from_dict
    assert recipe_from_dict(raw).pipeline_stage == 2   # planning is unaffected


@pytest.mark.parametrize("key,value", [
    ("recompute_config.recompute", [0, 0]), ("recompute_config.recompute", False),
    ("recompute_config.select_recompute", []), ("recompute_config.select_recompute", {}),
    ("use_legacy", True), ("resume_training", False), ("resume_training", ""), ("context.deterministic", "OFF"),
    ("parallel.strategy_ckpt_load_file", ""),
])
def test_values_that_ask_for_nothing_still_train(key, value):
    raw = load_recipe(MF).raw
    sec, _, leaf = key.rpartition(".")
    (raw.setdefault(sec, {}) if sec else raw)[leaf] = value
    assert not [k for k, _ in schema.train_refusals(raw, "CPU") if k == key]


def test_runner_batch_size_fills_and_checks_the_data():
    raw = load_recipe(TINY).raw
    raw["runner_config"] = {"batch_size": 3}
    del raw["data"]["micro_batch_size"]
    assert RunConfig.from_raw(raw).data.micro_batch_size == 3   # filled from MindFormers' key
    raw["data"]["micro_batch_size"] = 2
    with pytest.raises(SpecError, match=r"^runner_config.batch_size: 3 but data.micro_batch_size is 2"):
        RunConfig.from_raw(raw)


def test_unused_mindformers_keys_are_named():
    raw = _raw(callbacks=[{"type": "MFLossMonitor"}], output_dir="./output")
    raw["context"] = dict(raw.get("context") or {}, max_device_memory="58GB")
    assert {"callbacks", "output_dir", "context.max_device_memory"} <= set(schema.unused_keys(raw))


def test_every_shipped_recipe_passes_the_key_check():
    for name in sorted(os.listdir(os.path.join(ROOT, "recipes"))):
        if name.endswith(".yaml"):
            schema.check_keys(load_recipe(recipe(name)).raw)


@pytest.mark.parametrize("override,words", [
    ("data.seq_len=true", "data.seq_len: unknown key; allowed: micro_batch_size, text_len"),
    ("data.text_len=true", "data.text_len: must be a whole number >= 1, got True"),
])
@pytest.mark.parametrize("command", ["plan", "check", "simulate"])
def test_generated_data_keys_checked_by_the_planning_commands_too(command, override, words):
    p = run_main(command, TINY, "--set", override)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], p.stderr


def test_micro_batches_without_pipeline_refused_for_a_mindformers_recipe():
    """MindFormers resets micro_batch_num to 1 when pipeline_stage is 1 (no accumulation): a MindFormers
    training recipe asking for more is refused for training naming the key (plan still reads it as given);
    the project's train: recipes accumulate."""
    from hyperparallel.runconfig import load_parsed
    planned = load_parsed(MF, ["parallel_config.pipeline_stage=1", "mpipe.schedule=1f1b"])
    assert (planned.pipeline_stage, planned.micro_batch_num) == (1, 4)
    with pytest.raises(SpecError) as e:
        planned.run
    assert str(e.value).startswith("parallel_config.micro_batch_num: 4 with pipeline_stage 1: MindFormers resets it "
                                   "to 1"), str(e.value)
    r = load_recipe(MF, ["parallel_config.pipeline_stage=1", "parallel_config.micro_batch_num=1",
                         "mpipe.schedule=1f1b"])
    assert (r.pipeline_stage, r.micro_batch_num) == (1, 1)
    own = load_recipe(recipe("mf_llama_mllm.yaml"), ["parallel_config.pipeline_stage=1", "mpipe.schedule=1f1b"])
    assert own.micro_batch_num > 1


def test_the_recipe_is_parsed_once_and_a_rank_reads_the_same_parse():
    """One parsed object for every front end and every rank (``runconfig.ParsedRecipe``): its run config is built
    once and holds the recipe's own train settings; a rank, parsing the raw dict of its job case (JSON) through
    the same function, gets the same run config; a MindFormers training value ``train`` refuses is a plan note,
    raised with that message by ``train`` and ``run``."""
    from hyperparallel.runconfig import load_parsed, parse_recipe
    front = load_parsed(TINY, ["train.seed=7"])
    rc = front.run
    assert front.run is rc and rc.train is front.train and front.train.seed == 7
    rank = parse_recipe(json.loads(json.dumps(front.raw))).run   # what runtime/job.py builds from case["raw"]
    assert (rank.train, rank.data, rank.device, rank.compile, rank.compile_fallback, rank.model.regions()) == \
        (rc.train, rc.data, rc.device, rc.compile, rc.compile_fallback, rc.model.regions())
    refused = load_parsed(MF, ["optimizer.type=Lion"])
    words = "optimizer.type: 'Lion' is not supported; allowed: AdamW, Adam, SGD"
    assert refused.notes == (f"note: {words} (train refuses it; the plan does not read it)",)
    for read in ("train", "run"):
        with pytest.raises(SpecError) as e:
            getattr(refused, read)
        assert str(e.value) == words, read
