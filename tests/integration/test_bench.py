"""``hyperparallel profile`` and ``hyperparallel bench``: orchestration (fast, no MindSpore job)
and one small real run (msrun). No timing assertions: timings belong to the benchmark output."""
import json
import os
import shutil

import pytest
import yaml

from hyperparallel.bench import bench as B
from hyperparallel.bench import profile as PR
from hyperparallel.cli import build_parser
from hyperparallel.launch import LaunchResult
from hyperparallel.recipe import derive_recipe
from hyperparallel.recipe import load_recipe

from fake_bench import FakeLauncher, profile_rank as _profile_rank, rank_result as _rank
from helpers import run_cli, run_main

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(ROOT, "recipes", "tiny_mllm.yaml")
HEAVY = os.path.join(ROOT, "recipes", "bench_encoder_heavy.yaml")




# -- pure math ------------------------------------------------------------------------------

def test_launch_plan_alternates_schedules_and_rotates_the_start():
    case = lambda *i: [("case", x) for x in i]  # noqa: E731
    assert B.launch_plan("launches", 2, 3, False, False) == [(r, case(i)) for r in range(3) for i in (0, 1)]
    assert B.launch_plan("launches", 2, 1, True, True) == [(0, [("profile", -1)]), (0, [("reference", -1)]),
                                                           (0, case(0)), (0, case(1))]
    head = [("profile", -1), ("reference", -1)]
    assert B.launch_plan("steps", 3, 3, True, True) == [(0, head + case(0, 1, 2)), (1, head + case(1, 2, 0)),
                                                        (2, head + case(2, 0, 1))]
    assert B.launch_plan("steps", 2, 2, False, False) == [(0, case(0, 1)), (1, case(1, 0))]


def test_median_ratio_and_error():
    assert B.median([3.0, 1.0, 2.0]) == 2.0 and B.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    rows = B.summarize(["a", "b"], {"a": [0.30, 0.32, 0.31], "b": [0.20, 0.19, 0.21, 0.2]},
                       {"a": 0.33, "b": None})
    assert rows[0]["ratio"] == 1.0 and rows[0]["median_step_s"] == pytest.approx(0.31)
    assert rows[1]["ratio"] == pytest.approx(0.31 / 0.20)
    assert rows[0]["error"] == pytest.approx(0.33 / 0.31 - 1) and rows[1]["error"] is None
    assert rows[1]["min_step_s"] == 0.19 and rows[1]["samples"] == 4


def test_warmup_steps_discarded_and_slowest_rank_counts():
    ranks = [_rank(0, [9.0, 5.0, 1.0, 2.0]), _rank(1, [9.0, 5.0, 1.5, 1.0])]
    assert B.kept_step_times(ranks, warmup=2) == [1.5, 2.0]
    assert B.kept_step_times(ranks, warmup=0) == [9.0, 5.0, 1.5, 2.0]
    bd = B.breakdown(ranks, warmup=2)
    assert bd[0]["share"]["interp"] == pytest.approx(0.002 / 3.0)
    assert bd[0]["interp_us_per_action"] == pytest.approx(0.001 / 10 * 1e6)


def test_disturbed_steps_dropped_unless_too_few_remain():
    ranks = [_rank(0, [1.0, 1.0, 1.0, 2.0]), _rank(1, [1.0, 1.0, 1.0, 1.0])]
    ranks[1]["steps"][3]["foreign_cpu_s"] = 0.5  # another process used rank 1's core for half of step 3
    steps = B.kept_steps(ranks, warmup=0)
    assert steps[3] == (2.0, 0.5) and steps[0] == (1.0, 0.0)
    assert B.undisturbed(steps, 0.05) == ([1.0, 1.0, 1.0], 1, False)
    assert B.undisturbed(steps, 0.6) == ([1.0, 1.0, 1.0, 2.0], 0, False)
    assert B.undisturbed([(1.0, 0.5), (2.0, 0.0)], 0.05) == ([1.0, 2.0], 0, True)


# -- the command with a stand-in launcher ------------------------------------------------------

def test_bench_json_png_and_alternation(tmp_path, capsys):
    args = build_parser().parse_args(["bench", TINY, "--schedule", "1f1b", "--schedule", "transpose",
                                      "--repeats", "2", "--steps", "3", "--warmup", "2",
                                      "--recipe-profile", "--rotate", "launches",
                                      "--out", str(tmp_path / "b.json"), "--png", str(tmp_path / "b.png"),
                                      "--run-dir", str(tmp_path / "run")])
    fake = FakeLauncher()
    assert B.run(args, launcher=fake) == 0
    assert fake.order == ["1f1b", "transpose", "1f1b", "transpose"]
    out = json.loads((tmp_path / "b.json").read_text())
    rows = out["schedules"]
    assert [r["schedule"] for r in rows] == ["1f1b", "transpose"]
    for r in rows:
        assert {"schedule", "median_step_s", "ratio", "predicted_step_s"} <= set(r)
        assert r["samples"] == 6 and r["predicted_step_s"] > 0  # 2 repeats x 3 kept steps
        assert r["repeat_medians_s"] == pytest.approx([r["median_step_s"]] * 2)  # one per launch
        assert {"peak_rss_mb", "predicted_peak_mb", "share"} <= set(r["ranks"][0])
    assert rows[0]["median_step_s"] == pytest.approx(0.3) and rows[1]["ratio"] == pytest.approx(1.5)
    assert (tmp_path / "b.png").stat().st_size > 1000
    text = capsys.readouterr().out
    assert "| `transpose` |" in text and "1.50x" in text


def test_bench_measure_profile_interleaves_profile_launches(tmp_path):
    prof = tmp_path / "measured.yaml"
    args = build_parser().parse_args(["bench", TINY, "--schedule", "1f1b", "--schedule", "transpose",
                                      "--repeats", "2", "--steps", "1", "--warmup", "2", "--measure-profile",
                                      "--profile-schedule", "none", "--rotate", "launches",
                                      "--save-profile", str(prof), "--out", str(tmp_path / "b.json"),
                                      "--run-dir", str(tmp_path / "run")])
    fake = FakeLauncher()
    assert B.run(args, launcher=fake) == 0
    assert fake.order == ["profile", "1f1b", "transpose"] * 2
    block = yaml.safe_load(prof.read_text())["mpipe"]["profile"]
    assert block["regions"][0]["forward_ms"] == 4.0  # 8 ms over the tiny recipe's 2 vision layers
    out = json.loads((tmp_path / "b.json").read_text())
    assert out["profile"] == str(prof) and all(r["predicted_step_s"] > 0 for r in out["schedules"])


@pytest.mark.parametrize("flags,field", [
    (["--steps", "0"], "--steps"),
    (["--repeats", "0"], "--repeats"),
    (["--warmup", "-1"], "--warmup"),
    (["--max-contention", "0"], "--max-contention"),
    (["--out", "result.txt"], "--out"),
    (["--png", "/no/such/dir/x.png"], "--png"),
    (["--schedule", "nonsense"], "schedule"),
    (["--schedule", "1f1b", "--schedule", "1f1b"], "--schedule"),
    (["--profile", "/no/such/profile.yaml"], "--profile"),
    (["--recipe-profile", "--save-profile", "p.yaml"], "--save-profile"),
    (["--recipe-profile", "--profile", HEAVY], "--recipe-profile"),
    (["--rotate", "sometimes"], "--rotate"),
    (["--profile-samples", "0"], "--profile-samples"),
    (["--set", "model.llm_heads=3"], "model.llm_heads"),
])
def test_bench_refuses_bad_input_before_launch(tmp_path, flags, field):
    p = run_main("bench", TINY, "--run-dir", str(tmp_path / "run"), *flags)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0], p.stderr
    assert not (tmp_path / "run").exists()  # nothing launched


def test_profile_refuses_bad_input_before_launch(tmp_path):
    for flags, field in ((["--samples", "0"], "--samples"),
                         (["--set", "parallel_config.pipeline_stage=1"], "pipeline_stage"),
                         (["--set", "data.video_prob=2"], "data.video_prob")):
        p = run_main("profile", TINY, "--run-dir", str(tmp_path / "run"), *flags)
        assert p.returncode == 2 and p.stderr.startswith("error: ") and field in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


# -- profile block from measurements ---------------------------------------------------------

def test_build_profile_per_layer_costs_and_data_charge(tmp_path):
    recipe = load_recipe(HEAVY, ["mpipe.profile.regions.0.trainable=true"])
    plan = derive_recipe(recipe, "1f1b")
    acts = []
    for mode, kind, region, chunk, ms in [("fused", "F", "vision", 0, 40.0), ("fused", "BW", "vision", 0, 80.0),
                                          ("split", "B", "vision", 0, 0.0),
                                          ("fused", "F", "llm", 0, 3.0), ("fused", "F", "llm", 1, 5.0),
                                          ("fused", "BW", "llm", 0, 6.0), ("fused", "BW", "llm", 1, 6.0),
                                          ("split", "B", "llm", 0, 2.0), ("split", "B", "llm", 1, 2.0)]:
        acts.append(dict(mode=mode, kind=kind, region=region, chunk=chunk, micro=0, ms=ms))
    rank = {"actions": acts, "data_ms": [1.0, 1.0], "output_bytes": {"vision": [2000, 2200], "llm": [8388, 8388]},
            "activation_mb": {"vision/0": 4.0, "llm/0": 0.2, "llm/1": 0.2},
            "param_mb": {"vision/0": 2.0, "llm/0": 0.1, "llm/1": 0.1},
            "output_mb": {"vision": 0.002, "llm": 0.008},
            "link": {"latency_ms": 0.1, "bandwidth_gb_s": 0.5, "points": []}}
    block = PR.build_profile(recipe, plan, [rank, dict(rank, link=None)])
    vis, llm = block["regions"]
    assert vis["forward_ms"] == 10.0 and vis["backward_ms"] == 0.0 and vis["weight_ms"] == 20.0
    # llm: chunk 0 gives 3 ms per layer (plus data generation 1 ms x P=2 / 2 layers); the last chunk's
    # excess (5 - 3 ms) is the head (output head and loss), run once by the chunk with the last layer
    assert llm["forward_ms"] == pytest.approx(3.0 + 1.0) and llm["head_forward_ms"] == 2.0
    assert llm["backward_ms"] == 2.0 and llm["weight_ms"] == 4.0
    assert llm["head_backward_ms"] == 0.0 and llm["head_weight_ms"] == 0.0 and "head_forward_ms" not in vis
    # the measured cut's total is reproduced by the cost model's task times
    from hyperparallel.mpipe.profile import parse_profile, task_ms
    prof = parse_profile(block)
    assert task_ms(prof.region("llm"), "F", 1, head=True) == pytest.approx(5.0 + 1.0)
    assert task_ms(prof.region("llm"), "F", 2, head=True) == pytest.approx(3.0 + 5.0 + 2.0)
    assert vis["param_mb"] == 0.5 and vis["activation_mb"] == 1.0
    assert block["link"] == {"latency_ms": 0.1, "bandwidth_gb_s": 0.5}
    out = tmp_path / "p.yaml"
    PR.write_profile(str(out), HEAVY, block, ["a comment"], ["profile", HEAVY])
    doc = yaml.safe_load(out.read_text())
    assert doc["mpipe"]["profile"] == block and doc["base_config"].endswith("bench_encoder_heavy.yaml")
    # the file is a recipe (inherits the measured one) and a --profile source
    p = run_main("simulate", str(out), "--schedule", "1f1b", "--json")
    assert p.returncode == 0, p.stderr
    r = B.load_with_profile(HEAVY, [], str(out))
    assert r.profile.region("vision").forward_ms == 10.0 and r.schedule == "transpose"


# -- one real run ------------------------------------------------------------------------------

@pytest.mark.msrun
def test_profile_then_bench_on_two_ranks(tmp_path):
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    prof = tmp_path / "tiny.profile.yaml"
    # eager chunks: this is about profile and bench end to end (compiled against eager: the test below, faked)
    p = run_cli("profile", TINY, "--samples", "1", "--repeats", "1", "--compile", "eager", "--out", str(prof),
                "--run-dir", str(tmp_path / "prof"), timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    block = yaml.safe_load(prof.read_text())["mpipe"]["profile"]
    assert [r["name"] for r in block["regions"]] == ["vision", "llm"]
    assert all(r["forward_ms"] > 0 for r in block["regions"]) and block["link"]["bandwidth_gb_s"] > 0
    assert block["measured_on"]["device"] == "CPU" and len(block["device_scale"]) == 2
    # the default: the profile measured in the run (tight loop + gpipe reference) and both schedules
    # step by step in rotation, all in one launch
    out = tmp_path / "bench.json"
    p = run_cli("bench", TINY, "--schedule", "1f1b", "--schedule", "transpose", "--repeats", "1", "--warmup", "1",
                "--steps", "2", "--profile-samples", "1", "--compile", "eager", "--out", str(out), "--save-profile", str(tmp_path / "m.yaml"),
                "--run-dir", str(tmp_path / "bench"), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["rotate"] == "steps" and res["profile_measured_here"] and len(res["device_scale"]) == 2
    rows = res["schedules"]
    assert [r["schedule"] for r in rows] == ["1f1b", "transpose"]
    for r in rows:
        assert r["median_step_s"] > 0 and r["predicted_step_s"] > 0 and r["ratio"] > 0
        assert 0 <= r["interp_share"] <= r["overhead_share"] < 1
        assert all(d["peak_rss_mb"] is None and "stall" in d["share"] for d in r["ranks"])  # shared process
        # each rank's measured memory (its own Cells and optimizer, even in a shared process): held forwards
        # as the cost model predicts, parameters, grads and Adam's state
        for d in r["ranks"]:
            m = d["memory"]
            assert m["peak_held_total"] == d["predicted_held_total"] > 0
            assert m["params_bytes"] > 0 and m["optimizer_bytes"] == 2 * m["grads_bytes"]
    assert [d["memory"]["peak_held"] for d in rows[1]["ranks"]] == [{"vision": 2, "llm": 2}, {"vision": 2, "llm": 1}]
    assert "memory per rank (MB)" in p.stdout and "| `transpose` |" in p.stdout
    measured = yaml.safe_load((tmp_path / "m.yaml").read_text())["mpipe"]["profile"]
    assert measured["step_overhead_ms"] > 0 and measured["action_overhead_ms"] > 0
    assert set(measured["measured_on"]) == {"cpu", "cores", "device", "mindspore"}
    # a stored profile, one launch per schedule: each schedule's own memory
    p = run_cli("bench", TINY, "--profile", str(prof), "--schedule", "transpose", "--rotate", "launches",
                "--repeats", "1", "--warmup", "1", "--steps", "1", "--out", str(out),
                "--run-dir", str(tmp_path / "bench2"), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    (r,) = json.loads(out.read_text())["schedules"]
    assert len(r["ranks"]) == 2 and all(d["peak_rss_mb"] > d["base_rss_mb"] > 0 for d in r["ranks"])


# -- in-pipeline profile (pure aggregation) ----------------------------------------------------

def _timed(rank, step, kind, region, chunk, ms, micro=0):
    return dict(step=step, kind=kind, region=region, chunk=chunk, micro=micro, ms=ms)


def test_pipeline_action_medians_drop_warmup_and_non_compute():
    r0 = {"rank": 0, "action_times": [_timed(0, 0, "F", "vision", 0, 500.0),      # warm-up: dropped
                                      _timed(0, 1, "F", "vision", 0, 60.0),
                                      _timed(0, 1, "SEND", "llm", 0, 9.0),         # not compute
                                      _timed(0, 2, "F", "vision", 0, 70.0, micro=1),
                                      _timed(0, 2, "BW", "llm", 0, 4.0)]}
    r1 = {"rank": 1, "action_times": [_timed(1, 1, "F", "llm", 1, 15.0), _timed(1, 1, "RECV", "llm", 0, 30.0)]}
    launch2 = [{"rank": 0, "action_times": [_timed(0, 3, "F", "vision", 0, 65.0)]}, {"rank": 1, "action_times": None}]
    t = PR.pipeline_action_medians([[r0, r1], launch2], warmup=1)
    assert t == {("F", "vision", 0): [60.0, 70.0, 65.0], ("BW", "llm", 0): [4.0], ("F", "llm", 1): [15.0]}


def _tight_block(trainable):
    return {"link": {"latency_ms": 0.2, "bandwidth_gb_s": 0.5}, "optimizer_factor": 2.0,
            "regions": [dict(name="vision", layers=4, trainable=trainable, forward_ms=10.0,
                             backward_ms=5.0 if trainable else 0.0, weight_ms=15.0 if trainable else 0.0,
                             activation_mb=0.03, output_mb=0.002, param_mb=0.5),
                        dict(name="llm", layers=2, trainable=True, forward_ms=4.0, backward_ms=1.0,
                             weight_ms=3.0, activation_mb=0.02, output_mb=0.007, param_mb=0.04)]}


def test_apply_pipeline_costs_frozen_encoder():
    recipe = load_recipe(HEAVY, [])
    plan = derive_recipe(recipe, "gpipe")  # vision c0 (4 layers), llm c0 and c1 (1 layer each)
    times = {("F", "vision", 0): [60.0, 64.0, 80.0], ("F", "llm", 0): [5.0, 7.0], ("F", "llm", 1): [15.0],
             ("BW", "llm", 0): [8.0], ("BW", "llm", 1): [12.0]}
    block = _tight_block(False)
    out = PR.apply_pipeline_costs(block, plan, times, data_ms=0.5)
    vis, llm = out["regions"]
    assert vis["forward_ms"] == 16.0 and vis["backward_ms"] == 0.0 and vis["weight_ms"] == 0.0  # median 64 / 4
    # llm: chunk 0 gives 6 ms per layer (+ data 0.5 ms x P=2 / 2 layers), chunk 1's 15 ms = 6 + a 9 ms head
    assert llm["forward_ms"] == pytest.approx(6.0 + 0.5) and llm["head_forward_ms"] == 9.0
    # fused BW 8 and 12 ms (head 4), split in the tight loop's B : W = 1 : 3
    assert (llm["backward_ms"], llm["weight_ms"]) == (2.0, 6.0)
    assert (llm["head_backward_ms"], llm["head_weight_ms"]) == (1.0, 3.0)
    # everything else as measured in the tight loop; the input block is not modified
    assert out["link"] == block["link"] and vis["param_mb"] == 0.5 and llm["activation_mb"] == 0.02
    assert block["regions"][0]["forward_ms"] == 10.0


def test_apply_pipeline_costs_split_backward_and_missing_actions():
    recipe = load_recipe(HEAVY, ["mpipe.profile.regions.0.trainable=true"])
    plan = derive_recipe(recipe, "gpipe")
    # vision ran B and W split; llm chunk 1 never ran a forward: the tight-loop forward is kept
    times = {("F", "vision", 0): [40.0], ("B", "vision", 0): [12.0], ("W", "vision", 0): [20.0],
             ("F", "llm", 0): [3.0]}
    out = PR.apply_pipeline_costs(_tight_block(True), plan, times, data_ms=1.0)
    vis, llm = out["regions"]
    assert (vis["forward_ms"], vis["backward_ms"], vis["weight_ms"]) == (10.0, 3.0, 5.0)
    assert (llm["forward_ms"], llm["backward_ms"], llm["weight_ms"]) == (4.0, 1.0, 3.0)
    # the tight B/W split was zero: the fused BW is halved
    blk = _tight_block(True)
    blk["regions"][0].update(backward_ms=0.0, weight_ms=0.0)
    vis = PR.apply_pipeline_costs(blk, plan, {("BW", "vision", 0): [16.0]}, data_ms=0.0)["regions"][0]
    assert vis["backward_ms"] == 2.0 and vis["weight_ms"] == 2.0


def test_bench_profile_schedule_adds_reference_launches(tmp_path):
    prof = tmp_path / "measured.yaml"
    args = build_parser().parse_args(["bench", TINY, "--schedule", "1f1b", "--schedule", "transpose",
                                      "--repeats", "2", "--steps", "1", "--warmup", "2", "--measure-profile",
                                      "--profile-schedule", "gpipe", "--save-profile", str(prof), "--rotate", "launches",
                                      "--out", str(tmp_path / "b.json"), "--run-dir", str(tmp_path / "run")])
    fake = FakeLauncher()
    assert B.run(args, launcher=fake) == 0
    assert fake.order == ["profile", "reference gpipe", "1f1b", "transpose"] * 2
    out = json.loads((tmp_path / "b.json").read_text())
    assert [r["schedule"] for r in out["schedules"]] == ["1f1b", "transpose"]
    assert out["profile_schedule"] == "gpipe"
    # in-pipeline 20 ms over the tiny recipe's 2 vision layers (the tight loop measured 8 ms)
    assert yaml.safe_load(prof.read_text())["mpipe"]["profile"]["regions"][0]["forward_ms"] == 10.0


def test_profile_schedule_needs_a_measured_profile(tmp_path):
    for flags in (["--recipe-profile"], ["--profile", HEAVY]):
        p = run_main("bench", TINY, "--profile-schedule", "gpipe", "--run-dir", str(tmp_path / "run"), *flags)
        assert p.returncode == 2 and p.stderr.startswith("error: --profile-schedule"), p.stderr
    p = run_main("bench", TINY, "--recipe-profile", "--measure-profile", "--run-dir", str(tmp_path / "run"))
    assert p.returncode == 2 and p.stderr.startswith("error: --recipe-profile"), p.stderr


def test_bench_default_rotates_schedules_in_one_launch_and_measures_the_profile_in_pipeline(tmp_path, capsys):
    """No profile flag: the profile is measured in the run (tight loop + reference gpipe in the same
    launch as the schedules), one launch per repeat, the rotation starting at another schedule."""
    prof = tmp_path / "measured.yaml"
    args = build_parser().parse_args(["bench", TINY, "--schedule", "1f1b", "--schedule", "transpose",
                                      "--repeats", "2", "--steps", "1", "--warmup", "2",
                                      "--save-profile", str(prof), "--out", str(tmp_path / "b.json"),
                                      "--run-dir", str(tmp_path / "run")])
    fake = FakeLauncher()
    assert B.run(args, launcher=fake) == 0
    assert fake.order == ["launch", "profile", "reference gpipe", "1f1b", "transpose",
                          "launch", "profile", "reference gpipe", "transpose", "1f1b"]
    out = json.loads((tmp_path / "b.json").read_text())
    assert out["rotate"] == "steps" and out["profile_measured_here"] and out["profile_schedule"] == "gpipe"
    rows = out["schedules"]
    assert [r["schedule"] for r in rows] == ["1f1b", "transpose"] and rows[1]["ratio"] == pytest.approx(1.5)
    # in-pipeline vision forward 20 ms over the tiny recipe's 2 vision layers
    assert yaml.safe_load(prof.read_text())["mpipe"]["profile"]["regions"][0]["forward_ms"] == 10.0
    assert "2 launches in" in capsys.readouterr().out


def test_host_stalls_count_only_waits_on_the_peers_host_work():
    """A send still blocked while its receiver did host work before posting the receive, and a
    receive waiting while its sender did host work before sending, are stalls; compute is not."""
    r0, r1 = _rank(0, [2.0]), _rank(1, [2.0])
    # step 0: rank 0 sends at 1.0 (returns 1.5); rank 1's previous call ended at 1.0, it posted at 1.3
    r0["steps"][0]["p2p"] = [["send", 1, 0.9, 1.0, 1.5],
                             # rank 0 waits from 1.6 on rank 1, which did host work 1.5 -> 1.8 before sending
                             ["recv", 1, 0.4, 1.6, 1.9]]
    r1["steps"][0]["p2p"] = [["recv", 0, 1.0, 1.3, 1.5],
                             ["send", 0, 1.5, 1.8, 1.85]]
    st = B.host_stalls([r0, r1])
    assert st[0][0] == pytest.approx(0.3 + 0.2)   # 1.0-1.3 while rank 1 posted late; 1.6-1.8 on its host work
    assert st[1][0] == pytest.approx(0.0)          # rank 0 was already sending when rank 1 posted
    # the same exchange with the receiver posted before the send and no host work: no stall
    r1["steps"][0]["p2p"][0] = ["recv", 0, 0.2, 0.2, 1.5]
    r0["steps"][0]["p2p"][0] = ["send", 1, 1.0, 1.0, 1.5]
    r0["steps"][0]["p2p"][1] = ["recv", 1, 1.5, 1.5, 1.9]
    r1["steps"][0]["p2p"][1] = ["send", 0, 1.85, 1.85, 1.9]
    st = B.host_stalls([r0, r1])
    assert st[0][0] == pytest.approx(0.0) and st[1][0] == pytest.approx(0.0)
    bd = B.breakdown([r0, r1], warmup=0)
    assert bd[0]["share"]["stall"] == 0.0


def test_memory_of_a_rank_is_the_largest_of_its_records_and_shown_beside_the_times():
    rec = lambda held, n: {"peak_held": held, "peak_held_total": n, "params_bytes": 1 << 20,  # noqa: E731
                           "grads_bytes": 1 << 20, "optimizer_bytes": 2 << 20, "optimizer_global_bytes": 16,
                           "peak_held_bytes": n * 1024}
    m = B.max_memory([rec({"vision": 1, "llm": 2}, 3), None, rec({"vision": 2, "llm": 1}, 2)])
    assert m["peak_held"] == {"vision": 2, "llm": 2} and m["peak_held_total"] == 3 and m["peak_held_bytes"] == 3072
    assert B.max_memory([None]) is None
    assert B.state_mb(m) == pytest.approx(4 + (16 + 3072) / 2 ** 20)
    row = {"schedule": "transpose", "median_step_s": 0.01, "ratio": 1.0, "predicted_step_s": None, "error": None,
           "ranks": [{"memory": m, "predicted_held_total": 3}, {"memory": None, "predicted_held_total": 2}]}
    line = B.format_table([row]).splitlines()[2]
    assert line == "| `transpose` | 10.0 | 1.00x | - | - | 4.00 / - | 3 (3) / - (2) |"


# -- compile modes (mpipe.compile) ------------------------------------------------------------------

def test_a_step_that_compiled_is_left_out_of_the_medians():
    ranks = [_rank(0, [9.0, 5.0, 1.0, 3.0, 1.2]), _rank(1, [9.0, 5.0, 1.0, 1.0, 1.0])]
    ranks[1]["steps"][3]["compiles"] = 1   # rank 1 met a new input shape in step 3: compile time, not step time
    assert B.compile_steps(ranks) == {3}
    assert B.kept_step_times(ranks, warmup=2) == [1.0, 1.2]
    ranks[0]["compile"] = [{"chunk": "vision/0", "mode": "jit", "compiles": 2, "compile_s": 1.5}]
    ranks[1]["compile"] = [{"chunk": "llm/0", "mode": "jit", "compiles": 1, "compile_s": 0.5}]
    assert B.compile_totals([ranks, ranks]) == [
        {"rank": 0, "chunk": "vision/0", "mode": "jit", "compiles": 2, "compile_s": 1.5},
        {"rank": 1, "chunk": "llm/0", "mode": "jit", "compiles": 1, "compile_s": 0.5}]


class ModeLauncher(FakeLauncher):
    """Bench results whose step time depends on the case's mpipe.compile (jit twice as fast)."""

    def __call__(self, job, world, log_dir, timeout_s=0, echo=True, script=None):
        if job["mode"] == "bench":
            self.order.append(job["raw"]["mpipe"]["compile"])
            os.makedirs(job["out_dir"], exist_ok=True)
            t = 0.2 if job["raw"]["mpipe"]["compile"] == "jit" else 0.4
            for r in range(world):
                res = _rank(r, [5.0] * 2 + [t] * (job["steps"] - 2))
                res["compile"] = [{"chunk": "llm/0", "mode": job["raw"]["mpipe"]["compile"],
                                   "compiles": 1 if job["raw"]["mpipe"]["compile"] == "jit" else 0, "compile_s": 0.7}]
                with open(os.path.join(job["out_dir"], f"rank_{r}.json"), "w") as f:
                    json.dump(res, f)
            return LaunchResult(returncode=0, log_dir=log_dir, wall_s=1.0)
        return super().__call__(job, world, log_dir, timeout_s, echo, script)


def test_bench_compares_compile_modes_every_schedule_under_each(tmp_path, capsys):
    args = build_parser().parse_args(["bench", TINY, "--schedule", "1f1b", "--schedule", "transpose",
                                      "--compile", "eager", "--compile", "jit", "--repeats", "2", "--steps", "3",
                                      "--warmup", "2", "--recipe-profile", "--out", str(tmp_path / "m.json"),
                                      "--run-dir", str(tmp_path / "run")])
    fake = ModeLauncher()
    assert B.run(args, launcher=fake) == 0
    assert [m for m in fake.order if m in ("eager", "jit")] == ["eager"] * 4 + ["jit"] * 4
    out = json.loads((tmp_path / "m.json").read_text())
    assert out["modes"] == ["eager", "jit"] and set(out["results"]) == {"eager", "jit"}
    assert [r["schedule"] for r in out["compare"]] == ["1f1b", "transpose"]
    for row in out["compare"]:
        assert row["modes"]["eager"]["speedup"] == pytest.approx(1.0)
        assert row["modes"]["jit"]["speedup"] == pytest.approx(2.0)
        assert row["modes"]["jit"]["speedup_repeats"] == pytest.approx([2.0, 2.0])
        assert row["modes"]["jit"]["compiles"] == 2 and row["modes"]["eager"]["compiles"] == 0   # 2 ranks
    assert out["results"]["jit"]["compile"] == "jit" and out["results"]["eager"]["compile"] == "eager"
    text = capsys.readouterr().out
    assert "| `transpose` | jit |" in text and "2.00x" in text
    assert os.path.isdir(tmp_path / "run" / "eager") and os.path.isdir(tmp_path / "run" / "jit")


def test_when_every_measured_step_compiled_they_are_kept():
    ranks = [_rank(0, [9.0, 5.0, 1.0, 3.0])]
    for st in ranks[0]["steps"]:
        st["compiles"] = 1
    assert B.kept_step_times(ranks, warmup=2) == [1.0, 3.0]


def test_profile_and_bench_check_their_output_files_before_launch(tmp_path):
    """``profile --out DIR`` ran the whole profile and then failed; a missing folder was created after it:
    both refused first, naming the flag, as is the recipe itself as the output; nothing launched."""
    own = tmp_path / "tiny.yaml"
    shutil.copy(TINY, own)
    (tmp_path / "adir.yaml").mkdir()
    for flags, part in ((["--out", str(tmp_path / "adir.yaml")], "is a directory; give a file name"),
                        (["--out", str(tmp_path / "nodir" / "p.yaml")], "does not exist; create it first"),
                        (["--out", str(own)], f"is the input {own}")):
        p = run_main("profile", str(own), "--run-dir", str(tmp_path / "run"), "--samples", "1", "--repeats", "1",
                     *flags)
        assert p.returncode == 2 and p.stderr.startswith("error: --out: ") and part in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
    for flag, path in (("--out", tmp_path / "nodir" / "b.json"), ("--save-profile", own)):
        p = run_main("bench", str(own), "--run-dir", str(tmp_path / "run"), flag, str(path))
        assert p.returncode == 2 and p.stderr.startswith(f"error: {flag}: ") and not (tmp_path / "run").exists()
    assert own.read_text() == open(TINY).read() and sorted(os.listdir(tmp_path)) == ["adir.yaml", "tiny.yaml"]


def test_build_profile_records_each_costs_spread_over_the_passes():
    """Each action's per-pass times (``passes_ms``) give every cost's (max - min) / median over the passes,
    written as the region's ``spread`` with ``repeats``; the costs themselves are as without them, and
    measurements without per-pass times (an older worker's) write no spread."""
    recipe = load_recipe(HEAVY, ["mpipe.profile.regions.0.trainable=true"])
    plan = derive_recipe(recipe, "1f1b")
    rows = [("fused", "F", "vision", 0, [40.0, 44.0, 36.0]), ("fused", "BW", "vision", 0, [80.0, 80.0, 80.0]),
            ("split", "B", "vision", 0, [0.0, 0.0, 0.0]),
            ("fused", "F", "llm", 0, [3.0, 3.0, 3.0]), ("fused", "F", "llm", 1, [5.0, 5.0, 5.0]),
            ("fused", "BW", "llm", 0, [6.0, 9.0, 6.0]), ("fused", "BW", "llm", 1, [6.0, 6.0, 6.0]),
            ("split", "B", "llm", 0, [2.0, 2.0, 2.0]), ("split", "B", "llm", 1, [2.0, 2.0, 2.0])]
    rank = {"actions": [dict(mode=m, kind=k, region=r, chunk=c, micro=0, ms=sorted(v)[1], passes_ms=v)
                        for m, k, r, c, v in rows],
            "data_ms": [0.0], "activation_mb": {"vision/0": 4.0, "llm/0": 0.2, "llm/1": 0.2},
            "param_mb": {"vision/0": 2.0, "llm/0": 0.1, "llm/1": 0.1}, "output_mb": {"vision": 0.002, "llm": 0.008},
            "link": None}
    block = PR.build_profile(recipe, plan, [rank])
    vis, llm = block["regions"]
    assert block["repeats"] == 3
    assert vis["forward_ms"] == 10.0 and vis["spread"] == {"forward_ms": pytest.approx(8 / 40), "weight_ms": 0.0}
    # llm weight per layer: chunk 0's BW - B = 4, 7, 4 ms over the passes: (7 - 4) / 4
    assert llm["spread"] == {"forward_ms": 0.0, "weight_ms": 0.75, "backward_ms": 0.0, "head_forward_ms": 0.0}
    from hyperparallel.mpipe.profile import parse_profile, profile_spread
    assert profile_spread(parse_profile(block)) == (0.75, "llm.weight_ms")
    old = {"actions": [{k: v for k, v in a.items() if k != "passes_ms"} for a in rank["actions"]]}
    plain = PR.build_profile(recipe, plan, [dict(rank, **old)])
    assert "repeats" not in plain and not any("spread" in r for r in plain["regions"])
    assert [{k: v for k, v in r.items() if k != "spread"} for r in block["regions"]] == plain["regions"]
