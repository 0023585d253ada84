"""A recipe written from docs/mindformers.md alone (MindFormers' seed, runner_config, runner_wrapper,
AdamW, CosineWithWarmUpLR, a model with a vision tower, ``mpipe: {schedule: transpose}``, no profile)
plans and trains on 2 msrun ranks as MindFormers would train it: the learning rate of every step is
MindFormers' schedule, the update is AdamW with the given weight decay (equal to a single-process
reference), the seed is the one given."""
import json
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
import yaml

from helpers import ROOT, recipe, run_cli, run_main

RECIPE = recipe("mf_llama_adamw.yaml")
STEPS = 6


def _metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(ln) for ln in f]


def test_docs_recipe_is_the_shipped_one():
    """The recipe docs/mindformers.md shows (section 'A MindFormers training recipe') is this file."""
    with open(os.path.join(ROOT, "docs", "mindformers.md")) as f:
        text = f.read()
    block = re.search(r"```yaml\n(# recipes/mf_llama_adamw.yaml\n.*?)```", text, re.S)
    assert block, "docs/mindformers.md has no recipes/mf_llama_adamw.yaml block"
    with open(RECIPE) as f:
        assert yaml.safe_load(block.group(1)) == yaml.safe_load(f)


def test_plans_with_estimated_costs_and_no_profile():
    with open(RECIPE) as f:
        assert "profile" not in yaml.safe_load(f)["mpipe"]
    p = run_main("plan", RECIPE)
    assert p.returncode == 0, p.stderr
    assert "note: costs estimated from the model config" in p.stdout
    assert "transpose" in p.stdout and "vision" in p.stdout, p.stdout


_LR = r"""
import json, sys
import mindspore as ms
from mindformers.core.lr import CosineWithWarmUpLR
lr = CosineWithWarmUpLR(learning_rate=1e-3, lr_end=1e-5, warmup_ratio=0.1, total_steps=%d)
print("LR" + json.dumps([float(lr(ms.Tensor(s, ms.int32)).asnumpy()) for s in range(%d)]))
""" % (STEPS, STEPS)


def _start(*args):
    """``python -m hyperparallel ARGS`` started, not waited for (read with ``.communicate()``)."""
    return subprocess.Popen([sys.executable, "-m", "hyperparallel", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("mftrain")
    out = {"dir": d}
    launcher_default = {k: v for k, v in os.environ.items() if k != "LOCAL_DEFAULT_PATH"}   # MindFormers' logs
    # the single-process references and MindFormers' schedule run beside the 2-rank job (each is its own
    # process; their start-up overlaps the job's)
    refs = {"ref": _start("train", RECIPE, "--reference", "--steps", str(STEPS), "--run-dir", str(d / "ref")),
            "ref_wd0": _start("train", RECIPE, "--reference", "--steps", "2", "--set", "optimizer.weight_decay=0.0",
                              "--run-dir", str(d / "ref_wd0")),
            "ref_seed": _start("train", RECIPE, "--reference", "--steps", "1", "--set", "seed=43",
                               "--run-dir", str(d / "ref_seed"))}
    lr = subprocess.Popen([sys.executable, "-c", _LR], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    # eager chunks: these tests are about MindFormers' training semantics (compiled Llama: the equivalence suite)
    out["pipe"] = run_cli("train", RECIPE, "--steps", str(STEPS), "--compile", "eager", "--run-dir", str(d / "pipe"),
                          "--save-dir", str(d / "ckpt"), timeout=600, env=launcher_default)
    for k, proc in refs.items():
        stdout, stderr = proc.communicate(timeout=600)
        out[k] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    stdout, stderr = lr.communicate(timeout=300)
    assert lr.returncode == 0, stderr[-2000:]
    out["mf_lr"] = json.loads([ln for ln in stdout.splitlines() if ln.startswith("LR")][0][2:])
    for k in ("pipe", "ref", "ref_wd0", "ref_seed"):
        assert out[k].returncode == 0, (k, out[k].stdout[-3000:] + out[k].stderr[-3000:])
    return out


@pytest.mark.msrun
def test_learning_rate_of_every_step_is_mindformers_schedule(runs):
    m = _metrics(runs["dir"] / "pipe")
    assert [r["step"] for r in m] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([r["lr"] for r in m], runs["mf_lr"], rtol=1e-6)
    assert runs["mf_lr"][0] > runs["mf_lr"][-1]   # the cosine decays


@pytest.mark.msrun
def test_adamw_with_weight_decay_and_clipping_equal_the_single_process_reference(runs):
    pipe, ref = _metrics(runs["dir"] / "pipe"), _metrics(runs["dir"] / "ref")
    np.testing.assert_allclose([r["loss"] for r in pipe], [r["loss"] for r in ref], rtol=1e-5)
    np.testing.assert_allclose([r["grad_norm"] for r in pipe], [r["grad_norm"] for r in ref], rtol=1e-4)
    np.testing.assert_allclose([r["lr"] for r in pipe], [r["lr"] for r in ref], rtol=1e-7)
    line = "optimizer AdamW (betas=(0.9, 0.95), eps=1e-08, weight_decay=0.1), CosineWithWarmUpLR (MindFormers)"
    assert line in runs["pipe"].stdout and line in runs["ref"].stdout
    assert "clip grad norm 1 (runner_wrapper)" in runs["pipe"].stdout
    # the weight decay is applied: without it the losses after the first update differ
    wd0 = _metrics(runs["dir"] / "ref_wd0")
    assert wd0[0]["loss"] == pytest.approx(ref[0]["loss"], rel=1e-6)
    assert abs(wd0[1]["loss"] - ref[1]["loss"]) > 1e-7
    # AdamW's state (MindFormers' BasicAdamW: adam_m / adam_v per parameter) is what the checkpoint holds
    p = run_cli("ckpt", str(runs["dir"] / "ckpt" / f"step_{STEPS}"), timeout=60)
    assert p.returncode == 0 and p.stdout.startswith(f"step_{STEPS}: complete"), p.stdout + p.stderr
    names = set()
    for r in (0, 1):
        with open(runs["dir"] / "ckpt" / f"step_{STEPS}" / f"rank_{r}.safetensors", "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]   # safetensors: 8-byte header length, then a JSON header
            names |= set(json.loads(f.read(n))) - {"__metadata__"}
    weights = {n for n in names if not n.startswith(("adam_m.", "adam_v.", "global_step", "learning_rate"))}
    assert "model.layers.0.attention.wq.weight" in weights and "vision.0.attn.wq" in weights
    assert {f"adam_m.{w}" for w in weights} <= names and {f"adam_v.{w}" for w in weights} <= names


@pytest.mark.msrun
def test_seed_is_the_one_given(runs):
    assert "seed 42 (seed)" in runs["pipe"].stdout and "seed 42 (seed)" in runs["ref"].stdout
    assert "seed 43 (seed)" in runs["ref_seed"].stdout
    first = _metrics(runs["dir"] / "ref")[0]["loss"]
    assert _metrics(runs["dir"] / "ref_seed")[0]["loss"] != pytest.approx(first, rel=1e-6)   # another init


@pytest.mark.msrun
def test_training_log_users_recognise(runs):
    out = runs["pipe"].stdout + runs["pipe"].stderr
    assert "[ERROR]" not in out   # MindSpore's CPU synchronize message is avoided (compat.barrier)
    for s in range(1, STEPS + 1):
        assert re.search(rf"\] step {s}/{STEPS} loss \d+\.\d+ lr \S+ grad_norm \S+ step_time \S+s \S+ samples/s "
                         rf"\S+ tokens/s eta \d+:\d\d:\d\d", out), s
    assert f"saved {runs['dir'] / 'ckpt' / f'step_{STEPS}'} (" in out
    m = _metrics(runs["dir"] / "pipe")
    assert all(r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * 14, rel=1e-6) for r in m)   # seq_length 14
    assert all(r["samples_per_s"] == pytest.approx(8 / r["step_time_s"], rel=1e-6) for r in m)    # M=4 x batch 2
    # MindFormers' own log files go under the run directory, not ./output
    assert os.path.isdir(runs["dir"] / "pipe" / "logs" / "mindformers" / "log")


@pytest.mark.msrun
def test_profile_measures_a_recipe_without_one(tmp_path):
    """``hyperparallel profile RECIPE --out FILE`` on a recipe with no ``mpipe.profile``: the file it writes
    inherits the recipe and plans with measured costs (no estimate note)."""
    out = tmp_path / "measured.yaml"
    p = run_cli("profile", RECIPE, "--samples", "1", "--repeats", "1", "--compile", "eager", "--out", str(out),
                "--run-dir", str(tmp_path / "prof"), timeout=400)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    with open(out) as f:
        block = yaml.safe_load(f)
    regions = block["mpipe"]["profile"]["regions"]
    assert [(r["name"], r["layers"]) for r in regions] == [("vision", 2), ("llm", 4)]
    assert all(r["forward_ms"] > 0 for r in regions)
    p = run_cli("plan", str(out), timeout=60)
    assert p.returncode == 0 and "costs estimated" not in p.stdout, p.stdout + p.stderr
