"""``mpipe.memory_limit_gb`` (issue 23 part 5): plan/simulate flag a plan over it, train refuses it."""
import json

import pytest

from hyperparallel.mpipe.cost import simulate
from hyperparallel.errors import SpecError
from hyperparallel.recipe import checked_plan, load_recipe, memory_excess, refuse_over_memory_limit

from helpers import recipe

LLM = recipe("llm_pipeline.yaml")   # P=4 M=8, 8 layers of 1 MB activations and 10 MB parameters
MB = 1 / 1024.0                     # GB


def _limit(gb):
    return f"mpipe.memory_limit_gb={gb}"


def test_cost_model_reports_the_parts_of_static_memory():
    rec = load_recipe(LLM)
    rep = simulate(checked_plan(rec, "1f1b"), rec.profile)
    d0 = rep.devices[0]
    # 2 layers x 10 MB parameters, as many grads, Adam's 2x optimizer state; 4 micro-batches x 2 MB stashed
    assert (d0.params_mb, d0.grads_mb, d0.optimizer_mb, d0.peak_activation_mb) == pytest.approx((20, 20, 40, 8))
    for d in rep.devices:
        assert d.params_mb + d.grads_mb + d.optimizer_mb == pytest.approx(d.static_memory_mb)
        assert d.peak_activation_mb + d.static_memory_mb == pytest.approx(d.peak_memory_mb)


def test_excess_names_every_device_over_the_limit_worst_first_with_its_parts():
    rec = load_recipe(LLM, [_limit(85 * MB)])   # peaks 88, 86, 84, 82 MB
    excess = memory_excess(rec, checked_plan(rec, "1f1b"))
    assert [e.device for e in excess] == [0, 1]
    assert excess[0].peak_gb == pytest.approx(88 * MB)
    assert excess[0].parts_gb == pytest.approx({"activations": 8 * MB, "params": 20 * MB, "grads": 20 * MB,
                                                "optimizer": 40 * MB})
    assert memory_excess(load_recipe(LLM), checked_plan(rec, "1f1b")) == []   # no limit, no excess
    with pytest.raises(SpecError, match=r"^mpipe.memory_limit_gb: device 0's predicted peak 0.08594 GB exceeds "
                                        r"0.0830078 GB \(activations 0.007812 \+ parameters 0.01953 \+ grads "
                                        r"0.01953 \+ optimizer state 0.03906 GB\); 2 of 4 devices"):
        refuse_over_memory_limit(rec, checked_plan(rec, "1f1b"))


def test_lean_order_fits_a_limit_its_fast_variant_exceeds():
    # V=2: one 1 MB / 10 MB layer per chunk, 80 MB static per device; peaks 8 (lean) and 13 (fast) chunks
    rec = load_recipe(LLM, ["parallel_config.pp_interleave_num=2", _limit(90 * MB)])
    assert memory_excess(rec, checked_plan(rec, "interleaved_zb")) == []
    fast = memory_excess(rec, checked_plan(rec, "interleaved_zb_fast"))
    assert [(e.device, round(e.peak_gb / MB, 6)) for e in fast] == [(1, 93.0), (0, 92.0), (2, 91.0)]


def test_simulate_json_gains_the_key_and_warns_per_plan_over_the_limit(cli):
    r = cli("simulate", LLM, "--schedule", "1f1b", "--schedule", "gpipe", "--set", _limit(87 * MB), "--json")
    assert r.returncode == 0, r.stderr
    one, gp = json.loads(r.stdout)
    assert [e["device"] for e in one["memory_limit_exceeded"]] == [0]
    assert set(one["memory_limit_exceeded"][0]) == {"device", "peak_gb", "limit_gb", "parts_gb"}
    assert [e["device"] for e in gp["memory_limit_exceeded"]] == [0, 1, 2, 3]   # gpipe holds all 8
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and all(x.startswith("warning: mpipe.memory_limit_gb: ") for x in lines)
    assert "1f1b: device 0's predicted peak" in lines[0] and "4 of 4 devices exceed it" in lines[1]
    r = cli("simulate", LLM, "--set", _limit(1), "--json")
    assert json.loads(r.stdout)["memory_limit_exceeded"] == [] and r.stderr == ""
    assert "memory_limit_exceeded" not in json.loads(cli("simulate", LLM, "--json").stdout)


def test_plan_flags_and_still_prints_the_plan(cli):
    r = cli("plan", LLM, "--set", _limit(85 * MB))
    assert r.returncode == 0 and "schedule 1f1b" in r.stdout
    assert r.stderr.startswith("warning: mpipe.memory_limit_gb: 1f1b: device 0's predicted peak 0.08594 GB")
    assert "2 of 4 devices exceed it" in r.stderr


def test_train_refuses_before_launch_naming_device_peak_and_parts(cli, tmp_path):
    run_dir = tmp_path / "run"
    r = cli("train", recipe("tiny_mllm.yaml"), "--set", _limit(0.001), "--run-dir", str(run_dir))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: mpipe.memory_limit_gb: device ")
    assert "predicted peak" in lines[0] and "activations" in lines[0] and "optimizer state" in lines[0]
    assert lines[0].endswith("refused before launch") and not run_dir.exists()


@pytest.mark.parametrize("value", ["0", "-2", "abc", "true", ".nan", "[1]", ".inf"])
@pytest.mark.parametrize("command", ["plan", "simulate", "train"])
def test_bad_limit_is_a_one_line_error_naming_the_field(cli, command, value):
    rec = recipe("tiny_mllm.yaml") if command == "train" else LLM
    r = cli(command, rec, "--set", f"mpipe.memory_limit_gb={value}")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: mpipe.memory_limit_gb: must be a positive number")


def test_runtime_from_recipe_refuses_before_any_set_up():
    from hyperparallel.api import Runtime
    with pytest.raises(SpecError, match=r"^mpipe.memory_limit_gb: device \d's predicted peak .* refused before launch$"):
        Runtime.from_recipe(recipe("tiny_mllm.yaml"), overrides=[_limit(0.001)])


def test_bench_refuses_before_launch(cli, tmp_path):
    r = cli("bench", recipe("tiny_mllm.yaml"), "--schedule", "1f1b", "--recipe-profile", "--set", _limit(0.001),
            "--run-dir", str(tmp_path / "b"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: mpipe.memory_limit_gb: device ")
    assert not (tmp_path / "b").exists()
