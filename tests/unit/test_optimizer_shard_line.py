"""``parallel_config.optimizer_shard: true`` reads as ZeRO level 1 (``train.zero: 2`` is level 2): ``plan`` and
``simulate`` say so in one line, the exported plan JSON (``meta.zero``) and ``simulate --json`` (``zero``) carry
it, and ``train``'s start banner prints the line."""
import json

import pytest

from helpers import recipe, run_main

TINY = recipe("tiny_mllm.yaml")
D2 = ("--set", "parallel_config.data_parallel=2")
LEVEL1 = ("ZeRO level 1 (parallel_config.optimizer_shard: true): optimizer state sharded over the data-parallel "
          "replicas, gradients all-reduced, D=2")


def test_plan_prints_optimizer_shard_as_zero_level_1_and_exports_it(tmp_path):
    out = tmp_path / "plan.json"
    r = run_main("plan", TINY, *D2, "--set", "parallel_config.optimizer_shard=true", "--export", str(out))
    assert r.returncode == 0, r.stderr
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("ZeRO")] == [LEVEL1]
    meta = json.loads(out.read_text())["meta"]
    assert meta["zero"] == {"level": 1, "key": "parallel_config.optimizer_shard", "line": LEVEL1}
    # the plan itself shards: an all-reduce then an all-gather over the data-parallel group
    kinds = [a["kind"] for a in json.loads(out.read_text())["programs"]["0"] if a.get("group") == "dp"]
    assert kinds[:2] == ["ALLREDUCE", "ALLGATHER"]


def test_plan_names_level_2_and_says_nothing_without_zero(tmp_path):
    r = run_main("plan", TINY, *D2, "--set", "train.zero=2")
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("ZeRO")] == [
        "ZeRO level 2 (train.zero: 2): optimizer state and gradients sharded over the data-parallel replicas "
        "(gradients reduce-scattered), D=2"]
    out = tmp_path / "plain.json"
    r = run_main("plan", TINY, *D2, "--set", "parallel_config.optimizer_shard=false", "--export", str(out))
    assert r.returncode == 0 and "ZeRO" not in r.stdout and "zero" not in json.loads(out.read_text())["meta"]


def test_train_banner_prints_the_zero_line_once(tmp_path, monkeypatch):
    pytest.importorskip("mindspore")
    from hyperparallel import launch as launch_mod
    seen = {}

    def fake(job, world, log_dir, **kw):   # no ranks: the banner is printed before the launch
        seen["plan_meta"] = job["cases"][0]["plan"]["meta"]
        return launch_mod.LaunchResult(returncode=0, log_dir=log_dir)
    monkeypatch.setattr(launch_mod, "launch", fake)
    r = run_main("train", TINY, *D2, "--set", "parallel_config.optimizer_shard=true", "--set", "device=CPU",
                 "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    assert [ln for ln in r.stdout.splitlines() if "ZeRO" in ln] == [LEVEL1]
    assert seen["plan_meta"]["zero"]["level"] == 1


def test_simulate_says_it_in_text_and_json():
    sets = (*D2, "--set", "parallel_config.optimizer_shard=true")
    r = run_main("simulate", TINY, *sets)
    assert r.returncode == 0 and [ln for ln in r.stdout.splitlines() if ln.startswith("ZeRO")] == [LEVEL1], r.stderr
    r = run_main("simulate", TINY, *sets, "--json")
    assert json.loads(r.stdout)["zero"] == {"level": 1, "key": "parallel_config.optimizer_shard", "line": LEVEL1}
    r = run_main("simulate", TINY, *D2, "--json")
    assert "zero" not in json.loads(r.stdout)
