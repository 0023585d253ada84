"""``hyperparallel train``: refusal before launch, metrics, checkpoints written, faults.

The fast tests need no MindSpore job; the ``msrun`` ones launch real 2-rank jobs.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "tiny_mllm.yaml")


def train(*args, env=None, timeout=300):
    e = dict(os.environ, **(env or {}))
    p = subprocess.run([sys.executable, "-m", "hyperparallel", "train", RECIPE, *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout, env=e)
    return p


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_train_cli_imports_no_mindspore():
    code = ("import sys, hyperparallel.commands.train, hyperparallel.commands.plan, hyperparallel.launch, hyperparallel.cli; "
            "assert 'mindspore' not in sys.modules, 'mindspore imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


@pytest.mark.parametrize("override,field", [
    ("data.video_prob=2", "data.video_prob"),
    ("data.images_per_sample=[0.5,0.2]", "data.images_per_sample"),
    ("model.llm_heads=3", "model.llm_heads"),
    ("model.bogus=1", "model.bogus"),
    ("train.optimizer=lbfgs", "train.optimizer"),
    ("train.optimizer_compile=O2", "train.optimizer_compile"),
    ("parallel_config.pipeline_stage=0", "parallel_config.pipeline_stage"),
    ("device=TPU", "device"),
])
def test_bad_recipe_refused_before_launch(tmp_path, override, field):
    p = train("--set", override, "--run-dir", str(tmp_path / "run"), timeout=60)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0], p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "run" / "logs").exists()  # nothing launched


def test_bad_schedule_and_resume_refused(tmp_path):
    p = train("--schedule", "nonsense", timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and "Traceback" not in p.stderr
    p = train("--resume", "--save-dir", str(tmp_path / "none"), timeout=60)
    assert p.returncode == 2 and "--resume" in p.stderr


def test_msrun_args_from_environment(monkeypatch):
    from hyperparallel.launch import msrun_command, msrun_overrides
    monkeypatch.setenv("HP_MSRUN_ARGS", "--worker_num=2 --local_worker_num 1 --master_addr=10.0.0.1 "
                                        "--master_port=8118 --node_rank=1 --cluster_time_out=600")
    cmd = msrun_command("job.json", 2, "logs", 1234, msrun_overrides(2))
    assert "--node_rank=1" in cmd and "--master_port=8118" in cmd and "--local_worker_num=1" in cmd
    assert "--master_addr=10.0.0.1" in cmd and "--join=True" in cmd and cmd[-1] == "job.json"


@pytest.mark.parametrize("value,field", [("--worker_num=3", "--worker_num"), ("--bogus=1", "--bogus")])
def test_bad_msrun_args_refused_before_launch(tmp_path, value, field):
    p = train("--run-dir", str(tmp_path / "run"), env={"HP_MSRUN_ARGS": value}, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error: HP_MSRUN_ARGS " + field), p.stderr
    assert not (tmp_path / "run" / "logs").exists()


def test_mindformers_style_recipe_is_accepted():
    """base_config inheritance + mpipe.encoder options: the run config and plan still build."""
    import argparse
    from hyperparallel.commands.train import _prepare
    args = argparse.Namespace(recipe=os.path.join(ROOT, "recipes", "tiny_mllm_mindformers.yaml"), overrides=[],
                              schedule=None, steps=None, save_every=None, resume=False, save_dir=None,
                              resume_from=None)
    recipe, rc, plan = _prepare(args)
    assert rc.model.depth("llm") == 4 and plan.num_devices == 2


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    d = tmp_path_factory.mktemp("full")
    # eager chunks: 12 steps of a new shape most steps, each a compile on every rank; the compiled path of
    # the same worker is the equivalence suites'
    p = train("--run-dir", str(d / "run"), "--save-dir", str(d / "ckpt"), "--compile", "eager", timeout=400)
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    return p, d


@pytest.mark.msrun
def test_tiny_recipe_trains_with_transpose(full_run):
    p, d = full_run
    m = metrics(d / "run")
    assert [r["step"] for r in m] == list(range(1, len(m) + 1)) and len(m) >= 10   # 1-based, as on the console
    assert all(set(r) >= {"step", "loss", "lr", "grad_norm", "step_time_s", "samples_per_s", "tokens_per_s", "eta_s",
                          "schedule"} for r in m)
    assert all(r["lr"] == 0.01 and r["grad_norm"] > 0 and r["samples_per_s"] > 0 for r in m)   # train: lr 0.01
    assert m[-1]["eta_s"] == 0
    assert all(r["schedule"] == "transpose" for r in m)
    # every line carries every rank's memory record (issue 23): transpose holds the encoder on both ranks
    assert all([x["rank"] for x in r["memory"]] == [0, 1] for r in m)
    assert [x["peak_held"] for x in m[-1]["memory"]] == [{"vision": 2, "llm": 2}, {"vision": 2, "llm": 1}]
    assert set(m[0]["memory"][0]) == {"rank", "device", "dp_index", "step", "peak_held", "peak_held_total",
                                      "peak_held_bytes", "params_bytes", "grads_bytes", "optimizer_bytes",
                                      "optimizer_global_bytes", "peak_grad_bytes"}
    losses = [r["loss"] for r in m]
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5]), losses  # it learns
    assert " step 1/" in p.stdout and "loss" in p.stdout  # per-step progress shown
    # the start banner says what compiles and what trains (counted on the ranks: the model's every parameter once)
    out = p.stdout.splitlines()
    assert out[1] == "compile: every chunk eager (mpipe.compile: eager)", out[:4]
    from hyperparallel.runtime import compat
    from hyperparallel.runconfig import load_parsed
    compat.setup_device("CPU")
    model = load_parsed(RECIPE).run.model
    n = {r: sum(int(q.size) for q in c.get_parameters()) for r, c in zip(model.region_names(), model.build_full())}
    assert (f"[transpose] parameters: vision {n['vision']:,} trainable; llm {n['llm']:,} trainable; in all "
            f"{n['vision'] + n['llm']:,} trainable, 0 frozen") in out, out[:6]
    assert f"saved {d / 'ckpt' / 'step_10'} (" in p.stdout   # each save on the console, not only in worker_0.log
    assert "[ERROR]" not in p.stdout + p.stderr
    steps = len(m)  # train.save_every=10: complete step directories at 10, 20, ... and at the end
    assert sorted(os.listdir(d / "ckpt")) == sorted(f"step_{s}" for s in range(10, steps + 1, 10))
    assert sorted(os.listdir(d / "ckpt" / f"step_{steps}")) == ["COMPLETE", "meta.json", "rank_0.safetensors",
                                                               "rank_1.safetensors"]


@pytest.mark.msrun
def test_reference_cli_matches_pipeline_metrics(full_run, tmp_path):
    _, d = full_run
    p = train("--reference", "--steps", "4", "--run-dir", str(tmp_path / "ref"), timeout=200)
    assert p.returncode == 0, p.stderr[-2000:]
    ref = [r["loss"] for r in metrics(tmp_path / "ref")]
    pipe = [r["loss"] for r in metrics(d / "run")][:4]
    np.testing.assert_allclose(pipe, ref, rtol=1e-5)


@pytest.mark.msrun
@pytest.mark.parametrize("mode", ["exit", "kill"])
def test_dead_rank_fails_job_fast_and_is_named(tmp_path, mode):
    """Rank 1 dies mid-step 2 (os._exit after a log line, or a silent SIGKILL)."""
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    spec = "1:2" + (":kill" if mode == "kill" else "")
    # a hang would hit train()'s timeout; no wall-clock assert (a slow CI machine must pass)
    # the optimizer's update op by op (bit-identical, tested): no ~4 s first-step compile before the fault
    p = train("--steps", "6", "--run-dir", str(tmp_path / "run"), "--set", "train.optimizer_compile=eager", "--compile", "eager",
              env={"HP_FAULT": spec}, timeout=200)
    assert p.returncode != 0
    err = p.stderr.strip().splitlines()[-1]
    assert err.startswith("error: job failed") and "rank 1 failed" in err, p.stderr
    assert "step 2/6" in p.stdout and "step 3/6" not in p.stdout  # it died in step index 2


# -- the console of --reference and ckpt --export-hf: the project's lines; other libraries' output in a log ------

QWEN = os.path.join(ROOT, "recipes", "qwen2_5_vl_tiny.yaml")
NOISE = ("Config not found for parakeet", "FutureWarning", "loss_type=None")   # mindone's / transformers' own


@pytest.fixture(scope="module")
def qwen_demo(tmp_path_factory):
    pytest.importorskip("mindone", reason="mindone is not installed")
    from hyperparallel.data.demo import write_demo
    paths = write_demo(str(tmp_path_factory.mktemp("qdemo")), 24, seed=3, videos=False)
    return [a for k, v in sorted(paths.items()) for a in ("--set", f"data.{k}={v}")]


def _quiet(p, log):
    """The console holds none of the libraries' lines and names the log once; the log holds them."""
    console = p.stdout + p.stderr
    assert not [w for w in NOISE if w in console], console[-3000:]
    assert console.count(f"other libraries' output (warnings, MindSpore, mindone): {log}") == 1, console[-3000:]
    return open(log).read()


@pytest.mark.slow
def test_reference_console_keeps_the_projects_lines_and_logs_the_libraries(qwen_demo, tmp_path):
    run = tmp_path / "ref"
    p = subprocess.run([sys.executable, "-m", "hyperparallel", "train", QWEN, "--reference", "--steps", "1",
                        "--run-dir", str(run), *qwen_demo], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "[reference] step 1/1 loss " in p.stdout and "[reference] optimizer " in p.stdout
    log = _quiet(p, str(run / "logs" / "reference.log"))
    assert all(w in log for w in NOISE), log[-3000:]   # every one of them printed, into the log
    assert len(metrics(run)) == 1


@pytest.mark.slow
def test_export_hf_console_keeps_the_projects_lines_and_logs_the_libraries(qwen_demo, tmp_path):
    """A one-device checkpoint of the tiny Qwen2.5-VL (saved in this process), exported: the console has the
    project's lines only, mindone's and transformers' output is in ``OUT.log`` beside the directory."""
    from hyperparallel.runtime import compat
    from hyperparallel.runtime.comm import LocalComm
    from hyperparallel.runtime.rank import RankRuntime
    from hyperparallel.recipe import checked_plan
    from hyperparallel.runconfig import load_parsed
    compat.setup_device("CPU")
    ov = [v for v in qwen_demo if v != "--set"] + ["parallel_config.pipeline_stage=1", "mpipe.compile=eager"]
    recipe = load_parsed(QWEN, ov)
    rc = recipe.run
    rt = RankRuntime(checked_plan(recipe, "1f1b"), rc.model, rc.source(), rc.train, LocalComm(), compile="eager",
                     log=None)
    rt.saver(str(tmp_path / "ckpt"), meta={"schedule": "1f1b"}).save(1)
    rt.close()
    out = tmp_path / "hf"
    p = subprocess.run([sys.executable, "-m", "hyperparallel", "ckpt", str(tmp_path / "ckpt" / "step_1"),
                        "--export-hf", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.splitlines()[-1].startswith(f"wrote {out}: ") and (out / "model.safetensors").exists()
    # the saver recorded where the tokenizer came from; the export wrote the processor from it
    tok = os.path.abspath(recipe.raw["data"]["tokenizer"])
    with open(tmp_path / "ckpt" / "step_1" / "meta.json") as f:
        assert json.load(f)["processor"]["tokenizer"] == tok
    assert "processor: wrote " in p.stdout and f"(tokenizer {tok})" in p.stdout
    assert {"tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"} <= set(os.listdir(out))
    assert not [f for f in os.listdir(out) if f.endswith(".log")]   # the log is beside the directory, not in it
    log = _quiet(p, str(out) + ".log")
    assert "Config not found for parakeet" in log, log[-3000:]
