"""``hyperparallel simulate``: JSON shape, comparison table, speedups, exact makespans."""
import json

import pytest

from helpers import recipe


def test_json_one_schedule_is_one_object_with_exact_closed_form(cli):
    # llm_pipeline: P=4, M=8, 2 layers per chunk at 1+1+1 ms per layer, free communication
    r = cli("simulate", recipe("llm_pipeline.yaml"), "--schedule", "1f1b", "--json")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert isinstance(obj, dict)
    assert obj["makespan_ms"] == pytest.approx((8 + 4 - 1) * 6.0)
    assert obj["bubble_ratio"] == pytest.approx(1 - 8 * 6.0 / 66.0, abs=1e-6)
    assert [d["device"] for d in obj["devices"]] == [0, 1, 2, 3]
    for d in obj["devices"]:
        assert set(d) >= {"device", "busy_ms", "peak_activation_mb", "peak_memory_mb"}
        assert d["busy_ms"] == pytest.approx(48.0)
    # 1F1B keeps min(P - s, M) micro-batches of 2 MB (2 layers x 1 MB) on device s
    assert [d["peak_activation_mb"] for d in obj["devices"]] == pytest.approx([8.0, 6.0, 4.0, 2.0])
    # + 20 MB params, 20 MB grads, 40 MB optimizer state per device
    assert [d["peak_memory_mb"] for d in obj["devices"]] == pytest.approx([88.0, 86.0, 84.0, 82.0])


def test_json_several_schedules_is_a_list_with_speedups(cli):
    r = cli("simulate", recipe("llm_pipeline.yaml"), "--schedule", "gpipe", "--schedule", "interleaved",
            "--set", "parallel_config.pp_interleave_num=2", "--json")
    assert r.returncode == 0, r.stderr
    objs = json.loads(r.stdout)
    assert [o["schedule"] for o in objs] == ["gpipe", "interleaved"]
    # 8 chunks of 1 layer (3 ms): interleaved = V*M*(f+b+w) + (P-1)(f+b+w)
    assert objs[1]["makespan_ms"] == pytest.approx(2 * 8 * 3.0 + 3 * 3.0)
    assert objs[0]["speedup"] == pytest.approx(1.0)
    for o in objs:
        assert o["speedup"] == pytest.approx(objs[0]["makespan_ms"] / o["makespan_ms"], rel=1e-5)


def test_table_compares_against_the_first(cli):
    r = cli("simulate", recipe("mllm_encoder_heavy.yaml"), "--schedule", "1f1b", "--schedule", "transpose")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "speedup" in lines[1] and "step_ms" in lines[1]
    row_1f1b = next(ln for ln in lines if ln.startswith("1f1b"))
    row_tr = next(ln for ln in lines if ln.startswith("transpose"))
    assert row_1f1b.split()[-1] == "1.00x"
    assert float(row_tr.split()[-1].rstrip("x")) > 1.4


def test_spill_comparison_runs_every_schedule_in_steady_state(cli):
    r = cli("simulate", recipe("mllm_frozen_vit.yaml"), "--schedule", "transpose", "--schedule",
            "transpose(owners=balanced)", "--schedule", "transpose(spill=next_step)", "--json")
    assert r.returncode == 0, r.stderr
    rr, bal, spill = json.loads(r.stdout)
    assert bal["speedup"] > 1.03 and spill["speedup"] > 1.05


def test_bad_steps_and_schedules_are_refused(cli):
    r = cli("simulate", recipe("llm_pipeline.yaml"), "--steps", "0")
    assert r.returncode == 2 and r.stderr.startswith("error: --steps")
    r = cli("simulate", recipe("mllm_encoder_heavy.yaml"), "--schedule", "transpose(spill=next_step)",
            "--set", "mpipe.profile.regions.0.trainable=true")
    assert r.returncode == 2 and "spill" in r.stderr and len(r.stderr.strip().splitlines()) == 1
