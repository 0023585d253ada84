"""Timelines: Chrome/Perfetto trace structure and the Gantt PNG."""
import json

import pytest

from hyperparallel.recipe import derive_recipe, load_recipe
from hyperparallel.mpipe.cost import simulate
from hyperparallel.mpipe.draw import PID_STRIDE, write_png, write_trace

from helpers import recipe


def _results(*schedules):
    rec = load_recipe(recipe("mllm_encoder_heavy.yaml"))
    out = []
    for s in schedules:
        plan = derive_recipe(rec, s)
        out.append((plan, simulate(plan, rec.profile)))
    return out


def test_trace_has_one_process_per_device_and_schedule_with_real_durations(tmp_path):
    results = _results("1f1b", "transpose")
    path = tmp_path / "t.json"
    write_trace(results, str(path))
    obj = json.loads(path.read_text())
    events = obj["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert len(names) == 8  # 2 schedules x 4 devices
    assert {pid for pid, _ in names} == {k * PID_STRIDE + d for k in (0, 1) for d in range(4)}
    assert any("transpose" in n and "device 3" in n for _, n in names)
    threads = {(e["pid"], e["tid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert {(0, 0, "compute"), (0, 1, "comm")} <= threads
    # every action of every program is one complete event, on the right thread
    for k, (plan, rep) in enumerate(results):
        for d in range(4):
            evs = [e for e in xs if e["pid"] == k * PID_STRIDE + d]
            assert len(evs) == len(plan.programs[d])
            for e in evs:
                compute = e["args"]["kind"] in ("F", "B", "W", "BW", "R")
                assert e["tid"] == (0 if compute else 1)
    # names show kind, region, chunk and micro-batch; durations are microseconds
    enc = [e for e in xs if e["pid"] == PID_STRIDE + 1 and e["name"].startswith("F vision")]
    assert [e["name"] for e in enc] == ["F vision c0 m1", "F vision c0 m5"]
    assert all(e["dur"] == pytest.approx(12.0 * 1000) for e in enc)  # 4 layers x 3 ms
    end_us = max(e["ts"] + e["dur"] for e in xs if e["pid"] < PID_STRIDE)
    assert end_us == pytest.approx(results[0][1].makespan_ms * 1000, rel=1e-6)


@pytest.mark.slow
def test_png_is_written_and_not_trivial(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image as mpimg

    path = tmp_path / "g.png"
    write_png(_results("1f1b", "transpose", "transpose(owners=balanced, spill=next_step)"), str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    img = mpimg.imread(str(path))
    assert img.shape[0] > 400 and img.shape[1] > 1000
    assert len({tuple(px) for px in img[::7, ::7].reshape(-1, img.shape[2]).round(2).tolist()}) > 6


def test_cli_writes_trace_and_png(cli, tmp_path):
    pytest.importorskip("matplotlib")
    t, p = tmp_path / "x.json", tmp_path / "x.png"
    r = cli("simulate", recipe("mllm_encoder_heavy.yaml"), "--schedule", "1f1b", "--schedule", "transpose",
            "--trace", str(t), "--png", str(p))
    assert r.returncode == 0, r.stderr
    assert json.loads(t.read_text())["traceEvents"] and p.stat().st_size > 20_000


@pytest.mark.slow
def test_cli_draws_the_zero_bubble_and_v_shape_orders(cli, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image as mpimg

    v2 = ("--set", "parallel_config.pp_interleave_num=2")
    for name, args in (("v2", ("--schedule", "interleaved", "--schedule", "interleaved_zb", "--schedule", "zbv",
                               "--schedule", "dualpipev") + v2),
                       ("v1", ("--schedule", "1f1b", "--schedule", "zb_h1"))):
        p = tmp_path / f"{name}.png"
        r = cli("simulate", recipe("llm_pipeline.yaml"), *args, "--png", str(p), "--json")
        assert r.returncode == 0, r.stderr
        objs = json.loads(r.stdout)
        assert objs[-1]["speedup"] > 1.0  # the zero-bubble variants beat their first
        img = mpimg.imread(str(p))
        assert p.stat().st_size > 20_000 and img.shape[0] > 100 * len(objs)
