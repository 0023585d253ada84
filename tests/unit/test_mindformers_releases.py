"""MindFormers configs of any release plan (issue 38 point 4): keys only other releases define
(``schema.OTHER_RELEASES``) and training values only ``train`` reads are accepted by ``plan``, ``check`` and
``simulate`` and named once; ``train`` names the top-level ones as not used and refuses what it cannot honour;
a typo stays refused with the nearest key."""
import json
import os

import pytest

from hyperparallel import cli
from hyperparallel.errors import SpecError
from hyperparallel.recipe import load_recipe, schema

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ADAMW = os.path.join(ROOT, "recipes", "mf_llama_adamw.yaml")   # MindFormers' own optimizer / lr_schedule
OLD = ["--set", "auto_tune=False", "--set", "profiler_level=1", "--set", "runner_config.per_epoch_size=5"]
NOTE = ("note: keys of other MindFormers releases, without effect on the plan: auto_tune (1.7-1.9 configs), "
        "profiler_level (1.7-1.9 configs), runner_config.per_epoch_size (1.0-1.2 configs)")


def _main(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_plan_check_simulate_accept_other_release_keys_and_name_them_once(capsys):
    rc, out, err = _main(capsys, "plan", ADAMW, *OLD)
    assert rc == 0, err
    assert out.splitlines().count(NOTE) == 1, out
    rc, out, err = _main(capsys, "check", ADAMW, *OLD)
    assert rc == 0 and out.splitlines()[0] == NOTE and out.splitlines()[1].startswith("OK: "), (out, err)
    rc, out, err = _main(capsys, "simulate", ADAMW, *OLD, "--json")
    assert rc == 0 and json.loads(out)["notes"] == [NOTE], err
    rc, out, _ = _main(capsys, "plan", ADAMW)   # none given: no note
    assert rc == 0 and "other MindFormers releases" not in out


def test_a_typo_at_the_top_level_stays_refused_with_the_nearest_key(capsys):
    rc, _, err = _main(capsys, "plan", ADAMW, "--set", "auto_tun=False")
    assert rc == 2 and err.startswith("error: auto_tun: unknown key at the top level of the recipe;"), err
    rc, _, err = _main(capsys, "plan", ADAMW, "--set", "runner_config.per_epoch_sise=5")
    assert rc == 2 and "runner_config.per_epoch_sise: unknown key" in err, err


def test_plan_names_an_optimizer_train_refuses_and_train_refuses_it(capsys):
    """``optimizer.type: FP32StateAdamWeightDecay`` (a MindFormers 1.9 optimizer the runtime lacks): plan read
    the layout only, yet refused it; now it plans with a note, and train refuses it before launch."""
    bad = ("--set", "optimizer.type=FP32StateAdamWeightDecay")
    rc, out, err = _main(capsys, "plan", ADAMW, *bad)
    assert rc == 0, err
    assert ("note: optimizer.type: 'FP32StateAdamWeightDecay' is not supported; allowed: AdamW, Adam, SGD "
            "(train refuses it; the plan does not read it)") in out.splitlines()
    rc, out, err = _main(capsys, "train", ADAMW, "--steps", "1", *bad)
    assert rc == 2 and err.strip() == ("error: optimizer.type: 'FP32StateAdamWeightDecay' is not supported; "
                                       "allowed: AdamW, Adam, SGD"), err


def test_hyperparallels_own_train_section_stays_checked_by_plan():
    with pytest.raises(SpecError, match=r"^train\.nonfinite: 'maybe' unknown"):
        load_recipe(ADAMW, ["train.nonfinite=maybe"])


def test_train_names_the_top_level_ones_unused_and_refuses_the_section_ones():
    raw = load_recipe(ADAMW, ["auto_tune=False", "profiler_level=1", "recompute=False"]).raw
    assert {"auto_tune", "profiler_level", "recompute"} <= set(schema.unused_keys(raw))
    assert not [k for k, _ in schema.train_refusals(raw, "CPU") if k in schema.OTHER_RELEASES]
    raw = load_recipe(ADAMW, ["recompute=True", "runner_wrapper.sens=1024", "runner_config.image_size=224"]).raw
    found = dict(schema.train_refusals(raw, "CPU"))
    assert found["recompute"].startswith("True is not supported; give false: no recompute")
    assert found["runner_wrapper.sens"] == ("a key of MindFormers 1.0-1.5 configs: MindFormers 1.9.0 spells the loss "
                                            "scale scale_sense; give runner_wrapper.scale_sense")
    assert found["runner_config.image_size"].startswith("a key of MindFormers 1.0-1.5 configs: not a runner_config")
    assert "recompute" not in schema.unused_keys(raw)   # refused, so not also called unused


def test_other_release_keys_are_not_1_9_template_keys():
    """The list holds only what 1.9.0's template lacks (a key 1.9.0 defines belongs in its own list)."""
    for key in schema.OTHER_RELEASES:
        sec, _, name = key.rpartition(".")
        assert (name not in schema.STRICT[sec]) if sec else (key not in schema.TOP), key


def test_old_release_keys_that_change_training_are_refused_by_train_and_named_by_plan(capsys):
    """Keys of MindFormers 0.x configs that load weights or set weight decay: plan names them once, train
    refuses them (a silently ignored ``resume_or_finetune_checkpoint`` would train from random weights)."""
    old = ["resume_or_finetune_checkpoint=/ckpt", "no_decay_params=[bias]", "runner_config.layer_decay=0.65",
           "runner_wrapper.clip_norm=1.0", "eval=False", "run_status=train"]
    sets = [a for s in old for a in ("--set", s)]
    rc, out, err = _main(capsys, "plan", ADAMW, *sets)
    assert rc == 0, err
    note = [ln for ln in out.splitlines() if "keys of other MindFormers releases" in ln]
    assert note == ["note: keys of other MindFormers releases, without effect on the plan: eval (0.6-0.7 configs), "
                    "run_status (0.3-0.7 configs), no_decay_params (0.3-0.7 configs), resume_or_finetune_checkpoint "
                    "(0.2-0.3 configs), runner_config.layer_decay (0.2-0.3 configs), runner_wrapper.clip_norm "
                    "(0.2 configs)"], out
    raw = load_recipe(ADAMW, old).raw
    found = dict(schema.train_refusals(raw, "CPU"))
    assert found["resume_or_finetune_checkpoint"].startswith("a key of MindFormers 0.2-0.3 configs: not read; start "
                                                             "from weights with model.pretrained")
    assert {"no_decay_params", "runner_config.layer_decay", "runner_wrapper.clip_norm"} <= set(found)
    assert {"eval", "run_status"} <= set(schema.unused_keys(raw))
    assert not {"resume_or_finetune_checkpoint", "no_decay_params"} & set(schema.unused_keys(raw))


def _mf_config(tmp_path, text):
    p = tmp_path / "mf.yaml"
    p.write_text(text)
    return str(p)


def test_a_predict_config_without_pipeline_keys_plans_with_mindformers_defaults(capsys, tmp_path):
    """MindFormers' TransformerOpParallelConfig defaults pipeline_stage and micro_batch_num to 1: a config
    without them (a predict or export config) plans one stage, named in a note; a recipe that is not a
    MindFormers config still has to give them."""
    f = _mf_config(tmp_path, "run_mode: predict\nmodel:\n  model_config: {num_layers: 4, hidden_size: 64, "
                             "num_heads: 4, vocab_size: 128, seq_length: 32}\n")
    rc, out, err = _main(capsys, "plan", f)
    assert rc == 0, err
    assert out.splitlines()[0] == "schedule 1f1b: P=1 M=1 V=1 D=1", out
    assert ("note: absent, so MindFormers' defaults (TransformerOpParallelConfig): parallel_config.pipeline_stage: 1, "
            "parallel_config.micro_batch_num: 1") in out.splitlines()
    f = _mf_config(tmp_path, "parallel_config: {pipeline_stage: 2, micro_batch_num: 4}\nmodel:\n  model_config: "
                             "{num_layers: 4}\n")
    rc, out, err = _main(capsys, "plan", f)
    assert rc == 0 and "MindFormers' defaults" not in out, err


def test_mtp_layers_count_in_the_layer_layout(capsys, tmp_path):
    """DeepSeek-V3's ``mtp_depth`` adds layers MindFormers lays out over the stages (61 + 1 over 16 stages:
    its public config's offsets sum to 62 % 16 = 14)."""
    offset = [1] * 15 + [-1]
    f = _mf_config(tmp_path, f"parallel_config: {{pipeline_stage: 16, micro_batch_num: 32}}\nmodel:\n  model_config: "
                             f"{{num_layers: 61, mtp_depth: 1, offset: {offset}}}\n")
    rc, out, err = _main(capsys, "plan", f)
    assert rc == 0, err
    assert "(62 layers; chunk layers@device)" in out.splitlines()[1], out
    f = _mf_config(tmp_path, "parallel_config: {pipeline_stage: 2, micro_batch_num: 4}\nmodel:\n  model_config: "
                             "{num_layers: 4, mtp_depth: -1}\n")
    rc, out, err = _main(capsys, "plan", f)
    assert rc == 2 and err.strip() == "error: model.model_config.mtp_depth: must be a whole number >= 0, got -1", err
    found = dict(schema.train_refusals(load_recipe(ADAMW, ["model.model_config.mtp_depth=2"]).raw, "CPU"))
    assert found["model.model_config.mtp_depth"].startswith("2 is not supported; give 0: no multi-token-prediction")
    assert "model.model_config.mtp_depth" not in dict(schema.train_refusals(load_recipe(ADAMW).raw, "CPU"))


def test_pretrained_model_dir_gives_the_sizes_where_it_holds_a_config(capsys, tmp_path):
    """MindFormers' newer configs take the model's sizes from ``pretrained_model_dir`` (a Hugging Face
    directory); a placeholder path is named in the refusal."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"num_hidden_layers": 6, "hidden_size": 64, "num_attention_heads": 4,
                                                "vocab_size": 128, "intermediate_size": 128}))
    text = "parallel_config: {pipeline_stage: 2, micro_batch_num: 4}\npretrained_model_dir: %s\nmodel:\n  model_config: {type: Qwen3Config}\n"
    rc, out, err = _main(capsys, "plan", _mf_config(tmp_path, text % hf))
    assert rc == 0, err
    assert out.splitlines()[1].endswith("(6 layers; chunk layers@device)"), out
    rc, out, err = _main(capsys, "plan", _mf_config(tmp_path, text % "/path/hf_dir"))
    assert rc == 2 and err.strip().endswith("; pretrained_model_dir '/path/hf_dir' holds no config.json to read them "
                                            "from"), err
