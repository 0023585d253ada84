"""Issue 14 seams without a MindSpore job: where the interpreter prefetches data, a profile's machine,
the head/overhead terms parsed, and the bare-loop tool's refusals."""
import os
import subprocess
import sys

import pytest

from hyperparallel.mpipe.derive import derive_recipe
from hyperparallel.mpipe.errors import SpecError
from hyperparallel.mpipe.profile import machine_differences, parse_profile
from hyperparallel.mpipe.recipe import load_recipe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = os.path.join(ROOT, "recipes", "bench_encoder_heavy.yaml")


def test_data_is_prefetched_before_the_receive_that_precedes_its_use():
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    from hyperparallel.mindspore.interpreter import prefetch_points
    plan = derive_recipe(load_recipe(HEAVY), "1f1b")
    # device 0: F v0 F l0 SEND F v1 F l1 SEND | RECV g0: micro-batch 2 (and its pixels) built before it
    # blocks, not between the receive and BW 0 / F v2; likewise micro-batch 3 before RECV g1
    assert prefetch_points(plan.programs[0], ("vision", 0)) == {6: [(2, 0, True)], 11: [(3, 0, True)]}
    # device 1 receives every micro-batch's activation: its side inputs are built before each receive
    assert prefetch_points(plan.programs[1], ("vision", 0)) == {i: [(m, 0, False)] for m, i in
                                                              enumerate((0, 4, 8, 12))}
    # next-step spill: the next step's encoder inputs are loaded while device 0 waits for its last grads
    spill = derive_recipe(load_recipe(HEAVY), "transpose(spill=next_step)")
    pts = prefetch_points(spill.programs[0], ("vision", 0))
    assert pts[14] == [(0, 1, True), (2, 1, True), (1, 1, False)]
    # the window stops before a SEND: nothing is built ahead of a send
    for i, items in pts.items():
        assert spill.programs[0][i].kind == "RECV"


def test_profile_records_its_machine_and_bench_warns_for_another():
    from hyperparallel.bench.machine import profile_warning, this_machine
    here = this_machine("CPU")
    assert set(here) == {"cpu", "cores", "device", "mindspore"} and here["cores"] >= 1
    regions = [{"name": "llm", "layers": 2}]
    same = parse_profile({"regions": regions, "measured_on": here})
    assert profile_warning(same, "CPU", "x.yaml") is None
    other = parse_profile({"regions": regions, "measured_on": dict(here, cpu="Kunpeng 920", cores=192)})
    w = profile_warning(other, "CPU", "x.yaml")
    assert w.startswith("warning: the profile in x.yaml was measured on another machine") and "Kunpeng 920" in w
    assert machine_differences(other.measured_on, here) == [f"cpu: 'Kunpeng 920' != {here['cpu']!r}",
                                                            f"cores: 192 != {here['cores']!r}"]
    assert "does not say where it was measured" in profile_warning(parse_profile({"regions": regions}), "CPU", "r")
    with pytest.raises(SpecError, match=r"measured_on\.gpu"):
        parse_profile({"regions": regions, "measured_on": {"gpu": "x"}})


def test_runtime_terms_are_parsed_and_refused_when_bad():
    p = parse_profile({"regions": [{"name": "llm", "layers": 2, "head_forward_ms": 3.0}],
                       "action_overhead_ms": 1.25, "step_overhead_ms": 7.0})
    assert p.action_overhead_ms == 1.25 and p.step_overhead_ms == 7.0 and p.region("llm").head_forward_ms == 3.0
    with pytest.raises(SpecError, match=r"mpipe.profile.step_overhead_ms"):
        parse_profile({"regions": [{"name": "llm", "layers": 2}], "step_overhead_ms": -1})
    with pytest.raises(SpecError, match=r"regions\[0\].head_forward_ms"):
        parse_profile({"regions": [{"name": "llm", "layers": 2, "head_forward_ms": "x"}]})


def test_bare_loop_refuses_what_it_cannot_run_before_launch(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bare_loop.py"), HEAVY, *args,
                               "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=60)
    p = run("--schedule", "transpose", "--set", "mpipe.profile.regions.0.trainable=true")
    assert p.returncode != 0 and "frozen encoder" in p.stderr, p.stderr
    p = run("--schedule", "gpipe")
    assert p.returncode != 0 and "--schedule" in p.stderr, p.stderr
    p = run("--pairs", "0")
    assert p.returncode != 0 and "--pairs" in p.stderr, p.stderr
    assert not (tmp_path / "run").exists()
