"""Checkpoints on real msrun jobs, against the single-process reference.

Four launches: (1) 1f1b P=2 saving every step, rank 1 SIGKILLed while saving step 2;
(2) ``--resume`` with transpose P=2 takes step 1 (the newest complete one) and trains to step 4 (a
partial last line appended to (1)'s ``metrics.jsonl``, as a full disk leaves it, is left out with a note);
(3) 4 ranks, three cases: 1f1b P=4 resuming from (2)'s transpose step 2, 1f1b P=4 starting from a plain
single-process MindSpore file, and D=2 x P=2 (2 micro-batches each, the same global batch) resuming
from (1)'s D=1 step 1, saving ``.ckpt``; (4) a checkpoint of another model refused by the ranks.
The step directories of (2) and (3)'s D=2 case load into the reference model with MindSpore's own
``load_checkpoint`` / ``load_param_into_net`` and its next step equals the reference's.
"""
import glob
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("mindspore", reason="mindspore is not installed")

from helpers import job_case, launch_cases  # noqa: E402
from hyperparallel.runtime import ckpt_files as cf  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "tiny_mllm.yaml")
P4 = ("parallel_config.pipeline_stage=4",)
DP2 = ("parallel_config.data_parallel=2", "parallel_config.micro_batch_num=2")


def train(*args, env=None, timeout=300):
    # the optimizer's update op by op (bit-identical, tested): no ~4 s first-step compile in each run
    args = (*args, "--set", "train.optimizer_compile=eager", "--compile", "eager")
    return subprocess.run([sys.executable, "-m", "hyperparallel", "train", RECIPE, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})))


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _reference():
    from hyperparallel.runtime import compat
    from hyperparallel.runconfig import load_parsed
    from hyperparallel.runtime.reference import Reference
    compat.setup_device("CPU")
    recipe = load_parsed(RECIPE)
    rc = recipe.run
    return Reference(rc, recipe.micro_batch_num * recipe.data_parallel,
                     {r.name: r.trainable for r in recipe.profile.regions})


@pytest.fixture(scope="module")
def ref_losses():
    ref = _reference()
    return [ref.step(s)[0] for s in range(5)]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A plain single-process MindSpore file (reference after 2 steps, parameters only) and the
    losses of a reference that starts from it at step 0 with a fresh optimizer."""
    import mindspore as ms
    path = str(tmp_path_factory.mktemp("pre") / "pretrained.safetensors")
    ref = _reference()
    for s in range(2):
        ref.step(s)
    ms.save_checkpoint(ref.all_params(), path, format="safetensors")
    fresh = _reference()
    for cell in fresh.cells:
        assert ms.load_param_into_net(cell, ms.load_checkpoint(path, format="safetensors"))[0] == []
    return path, [fresh.step(s)[0] for s in range(2)]


@pytest.fixture(scope="module")
def faulted(tmp_path_factory):
    d = tmp_path_factory.mktemp("fault")
    ckpt, run = str(d / "ckpt"), str(d / "run")
    p = train("--schedule", "1f1b", "--steps", "3", "--save-every", "1", "--save-dir", ckpt, "--run-dir", run,
              env={"HP_FAULT": "1:save:2:kill"})
    complete, incomplete = cf.list_steps(ckpt)
    state = {"complete": [s for s, _ in complete], "incomplete": [s for s, _ in incomplete],
             "step_2": sorted(os.listdir(os.path.join(ckpt, "step_2")))}
    return p, ckpt, run, state


@pytest.fixture(scope="module")
def resumed(faulted):
    _, ckpt, run, _ = faulted
    with open(os.path.join(run, "metrics.jsonl"), "a") as f:
        f.write('{"step": 3, "loss": 1.')   # a last line cut short (a full disk): left out, with a note
    p = train("--steps", "4", "--save-every", "1", "--save-dir", ckpt, "--run-dir", run, "--resume")
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    return p, ckpt, run


def _case(tmp, name, schedule, overrides, src, steps=4, **kw):
    return job_case(tmp, RECIPE, schedule, name, overrides, steps=steps, resume_from=cf.resolve(src).to_json(), **kw)


def _run(tmp, cases, world):
    res = launch_cases(tmp, cases, world)
    out = {}
    for c in cases:
        with open(os.path.join(c["dump_dir"], "losses.json")) as f:
            out[c["name"]] = json.load(f)
    return out, res


@pytest.fixture(scope="module")
def four(resumed, pretrained, faulted, tmp_path_factory):
    """One 4-rank launch of three cases: 1f1b P=4 from (2)'s transpose step 2 and from the single-process
    file, and D=2 x P=2 from (1)'s D=1 step 1 saving ``.ckpt`` (a launch's cases may differ in D)."""
    tmp = str(tmp_path_factory.mktemp("four"))
    _, ckpt, _ = resumed
    save = os.path.join(tmp, "ckpt")
    cases = [_case(tmp, "from_transpose_p2", "1f1b", P4, os.path.join(ckpt, "step_2")),
             _case(tmp, "from_single_process", "1f1b", P4, pretrained[0], steps=2),
             _case(tmp, "from_d1", "transpose", DP2, os.path.join(faulted[1], "step_1"), save_dir=save,
                   save_format="ckpt")]
    out, res = _run(tmp, cases, 4)
    return out, res, save


@pytest.fixture(scope="module")
def p4(four):
    return four[0], four[1]


@pytest.fixture(scope="module")
def dp2(four):
    return (four[0], four[1]), four[2]


@pytest.mark.msrun
def test_rank_killed_while_saving_leaves_the_step_incomplete(faulted):
    p, _, _, state = faulted
    assert p.returncode != 0 and "rank 1 failed" in p.stderr, p.stderr[-2000:]
    assert state["complete"] == [1] and state["incomplete"] == [2]
    assert "COMPLETE" not in state["step_2"] and "rank_1.safetensors" not in state["step_2"]
    # rank 0's part is there only if it finished writing before the job was stopped (a race with
    # the kill); either way the step is incomplete and resume ignores it (next test)
    assert set(state["step_2"]) <= {"rank_0.safetensors", ".tmp_rank_0.safetensors", ".tmp_rank_1.safetensors",
                                    ".digest_rank_0.safetensors.json", ".digest_rank_0.safetensors.json.tmp",
                                    "meta.json", "meta.json.tmp"}, state["step_2"]


@pytest.mark.msrun
def test_resume_takes_newest_complete_step_and_equals_uninterrupted(faulted, resumed, ref_losses):
    p, ckpt, run = resumed
    assert f"ignoring incomplete checkpoint {os.path.join(ckpt, 'step_2')} (no COMPLETE marker: not every rank "\
           "finished writing it)" in p.stdout, p.stdout
    assert f"resuming from {os.path.join(ckpt, 'step_1')} at step 1" in p.stdout
    assert f"] resumed from {os.path.join(ckpt, 'step_1')} at step 1" in p.stdout   # the ranks say so on the console
    assert f"note: {os.path.join(run, 'metrics.jsonl')}: its last line " in p.stdout, p.stdout
    assert " is cut short (Expecting " in p.stdout
    assert not [f for d in (ckpt, run) for f in os.listdir(d) if f.endswith(".lock")]   # the locks released
    m = metrics(run)  # step 1 from the killed 1f1b run, steps 2-4 from the resumed transpose run
    assert [r["step"] for r in m] == [1, 2, 3, 4]
    assert [r["schedule"] for r in m] == ["1f1b", "transpose", "transpose", "transpose"]
    np.testing.assert_allclose([r["loss"] for r in m], ref_losses[:4], rtol=1e-5)
    assert [s for s, _ in cf.list_steps(ckpt)[0]] == [4, 3, 2, 1]  # step 2 rewritten, complete


@pytest.mark.msrun
def test_resume_transpose_p2_as_1f1b_p4(p4, ref_losses):
    got = p4[0]["from_transpose_p2"]
    assert got["start"] == 2
    np.testing.assert_allclose(got["losses"], ref_losses[2:4], rtol=1e-5)


@pytest.mark.msrun
def test_start_from_single_process_mindspore_file(p4, pretrained):
    got = p4[0]["from_single_process"]
    assert got["start"] == 0
    np.testing.assert_allclose(got["losses"], pretrained[1], rtol=1e-5)
    assert any("fresh optimizer state" in line for line in p4[1].lines)


@pytest.mark.msrun
def test_resume_d1_as_d2(dp2, ref_losses):
    (out, _), save = dp2
    assert out["from_d1"]["start"] == 1
    np.testing.assert_allclose(out["from_d1"]["losses"], ref_losses[1:4], rtol=1e-5)
    meta = cf.read_meta(os.path.join(save, "step_4"))
    assert (meta["D"], meta["P"], meta["format"]) == (2, 2, "ckpt")
    assert meta["files"] == ["rank_0.ckpt", "rank_2.ckpt"]  # data-parallel copies written once


def _reference_cli(tmp_path, *args):
    run = str(tmp_path / "ref")
    p = subprocess.run([sys.executable, "-m", "hyperparallel", "train", RECIPE, "--reference", "--run-dir", run,
                        *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    return p, metrics(run)


@pytest.mark.msrun
def test_reference_resumed_from_a_step_equals_the_uninterrupted_one(resumed, ref_losses, tmp_path):
    """``train --reference --resume-from STEP`` (issue 38: the reference ignored it and started from the
    initial weights) continues at the step's weights, optimizer state and data position: its steps 3-4 are
    the uninterrupted reference's."""
    _, ckpt, _ = resumed
    step2 = os.path.join(ckpt, "step_2")
    p, m = _reference_cli(tmp_path, "--resume-from", step2, "--steps", "4")
    assert f"[reference] resumed from {step2} at step 2 (with its optimizer state)" in p.stdout, p.stdout
    assert [r["step"] for r in m] == [3, 4]
    np.testing.assert_allclose([r["loss"] for r in m], ref_losses[2:4], rtol=1e-5)


@pytest.mark.slow
def test_reference_started_from_a_single_process_file(pretrained, ref_losses, tmp_path):
    """A plain MindSpore file (no step, no optimizer state): the reference starts at step 0 from its weights
    with a fresh optimizer, not from the initial weights."""
    p, m = _reference_cli(tmp_path, "--resume-from", pretrained[0], "--steps", "2")
    assert "(fresh optimizer state)" in p.stdout, p.stdout
    np.testing.assert_allclose([r["loss"] for r in m], pretrained[1], rtol=1e-5)
    assert abs(m[0]["loss"] - ref_losses[0]) > 1e-3   # not the initial weights' loss


def _load_into_reference_and_step(files, fmt):
    """Plain MindSpore: every file of the step into the reference's cells and nn.Adam; one step."""
    import mindspore as ms
    ref = _reference()
    params = {}
    for f in files:
        params.update(ms.load_checkpoint(f, format=fmt))
    for cell in (*ref.cells, ref.opt.opt):
        not_loaded, _ = ms.load_param_into_net(cell, params)
        assert not_loaded == [], not_loaded[:5]
    return ref.step(4)[0]


@pytest.mark.msrun
def test_step_directories_load_into_the_reference_with_mindspore(resumed, dp2, ref_losses):
    _, ckpt, _ = resumed
    files = sorted(glob.glob(os.path.join(ckpt, "step_4", "*.safetensors")))
    assert len(files) == 2
    np.testing.assert_allclose(_load_into_reference_and_step(files, "safetensors"), ref_losses[4], rtol=1e-5)
    files = sorted(glob.glob(os.path.join(dp2[1], "step_4", "*.ckpt")))
    np.testing.assert_allclose(_load_into_reference_and_step(files, "ckpt"), ref_losses[4], rtol=1e-5)


@pytest.mark.msrun
def test_merged_single_file_loads_with_one_mindspore_call(resumed, ref_losses, tmp_path):
    import mindspore as ms
    _, ckpt, _ = resumed
    params_only, full = str(tmp_path / "model.safetensors"), str(tmp_path / "full.ckpt")
    for out, extra in ((params_only, []), (full, ["--with-optimizer"])):
        p = subprocess.run([sys.executable, "-m", "hyperparallel", "ckpt", ckpt, "--merge", out, *extra],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and f"from {os.path.join(ckpt, 'step_4')}" in p.stdout, p.stderr[-2000:]
    ref = _reference()
    names = {q.name for q in ref.all_params()}
    merged = ms.load_checkpoint(params_only, format="safetensors")
    assert set(merged) == names  # parameters only: what a single-process model needs
    step4 = {}
    for f in glob.glob(os.path.join(ckpt, "step_4", "*.safetensors")):
        step4.update(ms.load_checkpoint(f, format="safetensors"))
    assert all((merged[n].asnumpy() == step4[n].asnumpy()).all() for n in names)
    full_dict = ms.load_checkpoint(full)
    for cell in (*ref.cells, ref.opt.opt):
        assert ms.load_param_into_net(cell, full_dict)[0] == []
    np.testing.assert_allclose(ref.step(4)[0], ref_losses[4], rtol=1e-5)


def _digest(*dirs):
    h = {}
    for d in dirs:
        for f in sorted(glob.glob(os.path.join(d, "**", "*"), recursive=True)):
            if os.path.isfile(f) and "/logs/" not in f:
                with open(f, "rb") as fh:
                    h[f] = hashlib.sha256(fh.read()).hexdigest()
    return h


@pytest.mark.msrun
def test_checkpoint_of_another_model_refused_by_the_ranks(resumed):
    _, ckpt, run = resumed
    before = _digest(ckpt, run)
    p = train("--set", "model.llm_dim=64", "--steps", "6", "--save-every", "1", "--save-dir", ckpt,
              "--run-dir", run, "--resume")
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1, p.stderr[-2000:]
    assert err[0].startswith(f"error: --resume: {os.path.join(ckpt, 'step_4')} does not fit this model: "
                             "wrong shapes: llm.-1.embed.pos [14, 32] (model [14, 64])"), err[0]
    assert " step 5/6" not in p.stdout
    assert _digest(ckpt, run) == before  # nothing overwritten
