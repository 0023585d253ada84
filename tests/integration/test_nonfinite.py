"""Non-finite numbers (issue 41): refused in the recipe before launch, and a step whose loss or global
gradient norm is NaN or infinite stopped (``train.nonfinite: stop``) or skipped (``skip``) before its update.

Fast: the recipe's float keys (NaN, infinity, a number YAML reads as a string), ``train.nonfinite``'s values,
the strict-JSON metrics line. In process (MindSpore, no msrun): the ``--reference`` path stops and skips.
``msrun``: one 2-rank launch of two cases (``HP_FAULT=1:1:nan`` makes rank 1's gradients of step 2 NaN in
both): ``skip`` continues and its step-2 checkpoint equals step 1's; then ``lr 1e30`` (step 2's loss NaN)
stops the job with exit 65 naming the step, no step-2 checkpoint written.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hyperparallel.errors import SpecError
from hyperparallel.recipe.train import TrainConfig, yaml_float

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(ROOT, "recipes", "tiny_mllm.yaml")
MF = os.path.join(ROOT, "recipes", "mf_llama_adamw.yaml")


def strict_lines(path):
    """Every line of a metrics.jsonl, read as strict JSON (a bare NaN/Infinity fails)."""
    def refuse(c):
        raise ValueError(f"not JSON: {c}")
    with open(path) as f:
        return [json.loads(line, parse_constant=refuse) for line in f]


# -- refused before launch ----------------------------------------------------------------------------

@pytest.mark.parametrize("raw,words", [
    ({"train": {"lr": float("nan")}}, "train.lr: must be a finite number > 0, got nan"),
    ({"train": {"lr": float("inf")}}, "train.lr: must be a finite number > 0, got inf"),
    ({"train": {"lr": "1e-4"}}, "train.lr: '1e-4' is a string to YAML; write 1.0e-4"),
    ({"train": {"lr": "2E3"}}, "train.lr: '2E3' is a string to YAML; write 2.0e+3"),
    ({"train": {"hang_timeout_s": float("inf")}}, "train.hang_timeout_s: must be a finite number > 0, got inf"),
    ({"train": {"stop_grace_s": "1.5e1"}}, "train.stop_grace_s: '1.5e1' is a string to YAML; write 1.5e+1"),
    ({"train": {"nonfinite": "ignore"}}, "train.nonfinite: 'ignore' unknown; allowed: stop, skip"),
    ({"optimizer": {"type": "AdamW", "weight_decay": float("inf")}},
     "optimizer.weight_decay: must be a finite number >= 0, got inf"),
    ({"optimizer": {"type": "AdamW", "eps": "1e-8"}}, "optimizer.eps: '1e-8' is a string to YAML; write 1.0e-8"),
    ({"optimizer": {"type": "AdamW", "betas": ["9e-1", 0.95]}},
     "optimizer.betas: '9e-1' is a string to YAML; write 9.0e-1"),
    ({"optimizer": {"type": "SGD", "learning_rate": float("nan")}},
     "optimizer.learning_rate: must be a finite number > 0, got nan"),
    ({"optimizer": {"type": "AdamW", "learning_rate": "1e-4"},
      "lr_schedule": {"type": "CosineWithWarmUpLR", "learning_rate": 1.0e-4}},
     "optimizer.learning_rate: '1e-4' is a string to YAML; write 1.0e-4"),
    ({"lr_schedule": {"type": "CosineWithWarmUpLR", "learning_rate": "1e-4"}},
     "lr_schedule.learning_rate: '1e-4' is a string to YAML; write 1.0e-4"),
    ({"lr_schedule": {"type": "CosineWithWarmUpLR", "learning_rate": 1.0e-3, "lr_end": float("nan")}},
     "lr_schedule.lr_end: must be a finite number >= 0, got nan"),
    ({"lr_schedule": {"type": "ConstantWarmUpLR", "learning_rate": 1.0e-3, "warmup_lr_init": "1e-6"}},
     "lr_schedule.warmup_lr_init: '1e-6' is a string to YAML; write 1.0e-6"),
    ({"lr_schedule": {"type": "ConstantWarmUpLR", "learning_rate": 1.0e-3, "warmup_ratio": float("nan")}},
     "lr_schedule.warmup_ratio: must be a finite number >= 0, got nan"),
    ({"runner_wrapper": {"max_grad_norm": float("inf")}},
     "runner_wrapper.max_grad_norm: must be a finite number > 0, got inf"),
])
def test_non_finite_and_string_numbers_refused_naming_the_key(raw, words):
    with pytest.raises(SpecError) as e:
        TrainConfig.from_raw(raw)
    assert str(e.value).startswith(words), str(e.value)


def test_yaml_float_spelling():
    import yaml
    for text in ("1e-4", "1E-4", "1.0e4", "-2e3", "5e+1", ".5e3"):
        fixed = yaml_float(text)
        assert yaml.safe_load(text) == text   # YAML 1.1 reads these as strings
        assert yaml.safe_load(fixed) == float(text), (text, fixed)   # and the suggestion as the number
    assert yaml_float("1e-4") == "1.0e-4"
    assert yaml_float("nan") == yaml_float("inf") == yaml_float("fast") == yaml_float("") == ""


def test_nonfinite_policy_read_and_described():
    assert TrainConfig.from_raw({}).nonfinite == "stop"
    cfg = TrainConfig.from_raw({"train": {"nonfinite": "skip"}})
    assert cfg.nonfinite == "skip" and cfg.describe(4).endswith(", non-finite steps skipped (train.nonfinite: skip)")


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "hyperparallel", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("recipe,override,words", [
    (TINY, "train.lr=.nan", "error: train.lr: must be a finite number > 0, got nan"),
    (TINY, "train.lr=.inf", "error: train.lr: must be a finite number > 0, got inf"),
    (TINY, "train.lr=1e-4", "error: train.lr: '1e-4' is a string to YAML; write 1.0e-4"),
    (TINY, "train.nonfinite=warn", "error: train.nonfinite: 'warn' unknown; allowed: stop, skip"),
    (MF, "lr_schedule.learning_rate=1e-4", "error: lr_schedule.learning_rate: '1e-4' is a string to YAML; write "
                                           "1.0e-4"),
])
@pytest.mark.slow
def test_refused_before_launch(tmp_path, recipe, override, words):
    p = _cli("train", recipe, "--set", override, "--run-dir", str(tmp_path / "run"), timeout=60)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and lines == [words], p.stderr
    assert not (tmp_path / "run" / "logs").exists()   # nothing launched


def test_recipe_file_with_yaml_string_number_refused(tmp_path):
    path = tmp_path / "r.yaml"
    with open(TINY) as f:
        text = f.read()
    assert "  lr: 0.01\n" in text
    path.write_text(text.replace("  lr: 0.01\n", "  lr: 1e-4\n", 1))   # as a user writes it
    p = _cli("plan", str(path), timeout=60)
    assert p.returncode == 2 and p.stderr.strip() == "error: train.lr: '1e-4' is a string to YAML; write 1.0e-4", \
        p.stderr


# -- metrics.jsonl: strict JSON -----------------------------------------------------------------------

def test_metrics_line_is_strict_json():
    from hyperparallel.runtime.nonfinite import json_line, verdict
    rec = {"step": 2, "loss": float("nan"), "grad_norm": float("inf"), "lr": 0.01,
           "memory": [{"x": float("-inf")}, {"x": 1.5}], "ok": True, "name": "nan"}
    line = json_line(rec)
    assert "NaN" not in line and "Infinity" not in line
    assert json.loads(line, parse_constant=lambda c: 1 / 0) == {
        "step": 2, "loss": None, "grad_norm": None, "lr": 0.01, "memory": [{"x": None}, {"x": 1.5}], "ok": True,
        "name": "nan"}
    assert verdict(1.0, 2.0) == "" and verdict(float("nan"), 2.0) == "loss nan"
    assert verdict(1.0, float("inf")) == "grad norm inf"


# -- the single-process reference (in process) ---------------------------------------------------------

@pytest.mark.slow
def test_reference_stops_at_the_first_non_finite_step(tmp_path, capfd):
    # capfd: the reference sends other libraries' output to its log at the file-descriptor level, and
    # its own lines to the console's descriptors
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    from hyperparallel.cli import main
    run = tmp_path / "ref"
    rc = main(["train", TINY, "--reference", "--steps", "4", "--set", "train.lr=1.0e+30", "--set",
               "train.optimizer_compile=eager", "--run-dir", str(run)])
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("error: ")]
    assert rc == 65, err
    assert len(err) == 1 and err[0].startswith("error: training stopped (exit 65): non-finite step 2/4: loss nan"), err
    assert "stopped before its update" in err[0]
    m = strict_lines(run / "metrics.jsonl")
    assert [r["step"] for r in m] == [1] and np.isfinite(m[0]["loss"])   # step 2 never completed


def test_reference_skip_keeps_the_weights_and_continues(tmp_path):
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    from hyperparallel.runtime import compat
    from hyperparallel.runtime.reference import Reference
    from hyperparallel.runconfig import load_parsed
    compat.setup_device("CPU")
    recipe = load_parsed(TINY, ["train.lr=1.0e+30", "train.nonfinite=skip", "train.optimizer_compile=eager"])
    ref = Reference(recipe.run, recipe.micro_batch_num * recipe.data_parallel,
                    {r.name: r.trainable for r in recipe.profile.regions}, total_steps=3)
    loss, _ = ref.step(0)
    assert np.isfinite(loss) and not ref.skipped
    after_one = {p.name: p.asnumpy().copy() for p in ref.params}
    for s in (1, 2):   # the weights after a 1e30 update: every later step non-finite, skipped, the run goes on
        loss, _ = ref.step(s)
        assert ref.skipped and not np.isfinite(loss), s
    assert ref.steps_skipped == 2
    for p in ref.params:   # no NaN update was applied
        np.testing.assert_array_equal(p.asnumpy(), after_one[p.name], err_msg=p.name)
    assert int(ref.opt.opt.global_step.asnumpy()[0]) == 1   # MindSpore's optimizer stepped once


# -- a pipeline: every rank agrees, before the update (one msrun launch) -------------------------------

@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    from helpers import job_case
    from hyperparallel.launch import launch
    tmp = str(tmp_path_factory.mktemp("nonfinite"))
    cases = [job_case(tmp, TINY, "transpose", "skip", ["train.nonfinite=skip"], steps=4, save_every=1,
                      save_dir=os.path.join(tmp, "skip_ckpt"), run_dir=os.path.join(tmp, "skip_run")),
             job_case(tmp, TINY, "transpose", "stop", ["train.lr=1.0e+30"], steps=4, save_every=1,
                      save_dir=os.path.join(tmp, "stop_ckpt"), run_dir=os.path.join(tmp, "stop_run"))]
    old = os.environ.get("HP_FAULT")
    os.environ["HP_FAULT"] = "1:1:nan"   # rank 1's gradients of step 2 (index 1) NaN, in both cases
    try:
        res = launch({"cases": cases, "device": "CPU"}, 2, os.path.join(tmp, "log"), timeout_s=400, echo=False)
    finally:
        if old is None:
            del os.environ["HP_FAULT"]
        else:
            os.environ["HP_FAULT"] = old
    return res, tmp


def _tensors(path):
    from safetensors.numpy import load_file
    return {f: load_file(os.path.join(path, f)) for f in sorted(os.listdir(path)) if f.endswith(".safetensors")}


@pytest.mark.msrun
def test_pipeline_skip_policy_skips_the_update_on_every_rank(pipeline):
    _, tmp = pipeline
    m = strict_lines(os.path.join(tmp, "skip_run", "metrics.jsonl"))
    assert [r["step"] for r in m] == [1, 2, 3, 4]   # later steps continue
    assert [r["skipped"] for r in m] == [False, True, False, False]
    assert [r["steps_skipped"] for r in m] == [0, 1, 1, 1]
    assert m[1]["grad_norm"] is None and np.isfinite(m[1]["loss"])   # the NaN gradients: the norm, as null
    assert all(np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) for r in (m[0], m[2], m[3]))
    ckpt = os.path.join(tmp, "skip_ckpt")
    one, two, three = (_tensors(os.path.join(ckpt, f"step_{s}")) for s in (1, 2, 3))
    assert sorted(one) == ["rank_0.safetensors", "rank_1.safetensors"]
    for f in one:   # step 2 updated nothing on any rank: weights and optimizer state as after step 1
        assert sorted(one[f]) == sorted(two[f])
        for k in one[f]:
            np.testing.assert_array_equal(two[f][k], one[f][k], err_msg=f"{f} {k}")
            assert np.isfinite(three[f][k]).all(), (f, k)
        assert any(not np.array_equal(three[f][k], one[f][k]) for k in one[f]), f   # step 3 updated again


@pytest.mark.msrun
def test_pipeline_stops_at_the_first_non_finite_loss_naming_the_step(pipeline):
    res, tmp = pipeline
    assert res.returncode == 65, res.message + "\n" + "\n".join(res.lines[-20:])
    assert res.message.startswith("non-finite step 2/4: loss nan and grad norm nan (non-finite on ranks 0, 1); "
                                  "stopped before its update"), res.message
    assert res.message.endswith("nothing saved for step 2"), res.message
    ckpt = os.path.join(tmp, "stop_ckpt")
    assert sorted(os.listdir(ckpt)) == ["step_1"]   # no checkpoint of the stopped step, complete or not
    m = strict_lines(os.path.join(tmp, "stop_run", "metrics.jsonl"))
    assert [r["step"] for r in m] == [1] and np.isfinite(m[0]["loss"])


def test_console_error_line_of_a_non_finite_stop(tmp_path, monkeypatch, capsys):
    """What ``hyperparallel train`` prints for the launcher's exit 65 (the launch itself is tested above)."""
    from hyperparallel import launch as launcher
    from hyperparallel.cli import main
    msg = "non-finite step 2/4: loss nan (non-finite on rank 1); stopped before its update"

    def fake_launch(job, world, log_dir, **kw):
        return launcher.LaunchResult(returncode=launcher.NONFINITE, log_dir=log_dir, message=msg)
    monkeypatch.setattr(launcher, "launch", fake_launch)
    rc = main(["train", TINY, "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 65 and err == [f"error: training stopped (exit 65): {msg}"], err


def test_a_skipped_step_does_not_advance_the_schedule():
    """MindSpore's optimizer reads its schedule at its own global_step; a skipped step never calls it, so the
    logged lr is the schedule at the updates applied, not at the step index."""
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    import mindspore as ms
    from hyperparallel.runtime import compat
    from hyperparallel.runtime.optim import Optimizer
    compat.setup_device("CPU")
    cfg = TrainConfig.from_raw({"optimizer": {"type": "AdamW", "weight_decay": 0.0},
                                "lr_schedule": {"type": "CosineWithWarmUpLR", "learning_rate": 1.0e-3,
                                                "warmup_steps": 1, "total_steps": 6},
                                "train": {"optimizer_compile": "eager"}})
    w = ms.Parameter(ms.Tensor(np.ones(3, np.float32)), name="w")
    opt = Optimizer([w], cfg, total_steps=6)
    at = [opt.lr(s) for s in range(4)]   # nothing applied yet: every step's lr is the first
    assert len(set(at)) == 1
    want = [float(opt.schedule(ms.Tensor(i, ms.int32)).asnumpy()) for i in range(4)]
    assert len(set(want)) == 4   # the schedule moves every update
    g = {"w": ms.Tensor(np.full(3, 0.5, np.float32))}
    opt.step(g)                   # step 0 updated
    assert opt.lr(1) == want[1]
    # step 1 skipped (no opt.step): step 2's update is the schedule's second
    assert opt.lr(2) == want[1]
    opt.step(g)
    assert opt.lr(3) == want[2]
