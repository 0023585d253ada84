"""The cost model's per-device memory (issue 23 parts 2-3): held forwards per region, static memory's parts."""
import pytest

from hyperparallel.mpipe import check, derive, parse_profile
from hyperparallel.mpipe.cost import simulate, static_memory
from hyperparallel.mpipe.ir import B, BW, F, R, W
from hyperparallel.recipe import checked_plan, load_recipe

from helpers import recipe
from helpers import profile

ACT_MB = 2.0   # two layers of 1 MB per chunk


def llm(P, V):
    return profile(("llm", 2 * P * V, True, 0.5, 1.0, 0.25))


def run(prof, schedule, P, M, V=1, steps=1):
    plan = derive(prof, schedule, P, M, V)
    assert check(plan) == []
    return plan, simulate(plan, prof, steps=steps)


def held_in_program_order(plan, device, steps=1):
    """Peak held forwards per region, walking the device's program ``steps`` times (the prologue first):
    a forward (F or R) is held from its action to the last backward of its task on the device; a forward
    whose task the device recomputes (central backward) is not (the recompute is)."""
    prog = plan.programs[device]
    seq = [(0, a) for a in plan.prologue(device)] + [(s, a) for s in range(steps) for a in prog]
    last, recomputed = {}, set()
    for i, (s, a) in enumerate(seq):
        if a.kind in (B, W, BW):
            last[(s, a.region, a.chunk, a.micro)] = i
        elif a.kind == R:
            recomputed.add((s + a.step, a.region, a.chunk, a.micro))
    live, peak, total, total_peak = {}, {r: 0 for r in plan.regions()}, 0, 0
    release = {}
    for i, (s, a) in enumerate(seq):
        if a.kind in (F, R):
            key = (s + a.step, a.region, a.chunk, a.micro)
            if key in last and last[key] > i and not (a.kind == F and key in recomputed):
                release[last[key]] = release.get(last[key], []) + [a.region]
                live[a.region] = live.get(a.region, 0) + 1
                total += 1
                peak[a.region] = max(peak[a.region], live[a.region])
                total_peak = max(total_peak, total)
        for r in release.pop(i, []):
            live[r] -= 1
            total -= 1
    return peak, total_peak


@pytest.mark.parametrize("P,M", [(2, 4), (4, 4), (4, 8), (3, 7), (5, 3)])
def test_held_forwards_1f1b_and_gpipe_closed_forms(P, M):
    for order, expect in (("1f1b", lambda s: min(P - s, M)), ("gpipe", lambda s: M)):
        _, rep = run(llm(P, 1), order, P, M)
        assert [d.peak_held for d in rep.devices] == [{"llm": expect(s)} for s in range(P)]
        assert [d.peak_held_total for d in rep.devices] == [expect(s) for s in range(P)]
        # uniform chunks: the activation peak is the held count times a chunk's activations
        assert [d.peak_activation_mb for d in rep.devices] == pytest.approx(
            [expect(s) * ACT_MB for s in range(P)])


ORDERS_V = [("1f1b", 1), ("gpipe", 1), ("zb_h1", 1), ("interleaved", 2), ("interleaved_zb", 2), ("zbv", 2),
            ("dualpipev", 2), ("interleaved_zb_fast", 2), ("zbv_fast", 2)]


@pytest.mark.parametrize("order,V", ORDERS_V)
@pytest.mark.parametrize("P,M", [(2, 4), (4, 8)])
def test_held_forwards_of_the_timeline_equal_the_program_order_count(order, V, P, M):
    # what a rank counts walking its program is what the cost model reads off its timeline
    plan, rep = run(llm(P, V), order, P, M, V)
    for d in rep.devices:
        assert (d.peak_held, d.peak_held_total) == held_in_program_order(plan, d.device)


@pytest.mark.parametrize("schedule,over", [
    ("transpose", []), ("transpose(backward=central)", []), ("1f1b", []), ("zb_h1", []),
    ("transpose(owners=min)", []),
    ("transpose(spill=next_step)", ["mpipe.encoder.trainable=false"]),
    ("transpose", ["mpipe.encoder.trainable=false"]),
])
def test_held_forwards_of_encoder_schedules_per_region(schedule, over):
    rec = load_recipe(recipe("tiny_mllm.yaml"), over)
    plan = checked_plan(rec, schedule)
    steps = 3 if "spill" in schedule else 1
    rep = simulate(plan, rec.profile, steps=steps)
    for d in rep.devices:
        assert (d.peak_held, d.peak_held_total) == held_in_program_order(plan, d.device, steps)
    if over:   # frozen encoder: its forwards are never held
        assert all(d.peak_held["vision"] == 0 for d in rep.devices)


def test_held_forwards_of_the_tiny_recipe():
    rec = load_recipe(recipe("tiny_mllm.yaml"))   # P=2, M=4
    held = lambda s: [d.peak_held for d in simulate(checked_plan(rec, s), rec.profile).devices]  # noqa: E731
    # transpose: each device owns 2 encoder forwards and holds them to its cooldown backward
    assert held("transpose") == [{"vision": 2, "llm": 2}, {"vision": 2, "llm": 1}]
    # 1F1B: the encoder placed on device 0, each forward just before its LLM forward
    assert held("1f1b") == [{"vision": 2, "llm": 2}, {"vision": 0, "llm": 1}]
    # central backward: device 0 recomputes the encoder just before its BW; the owners hold nothing
    assert held("transpose(backward=central)") == [{"vision": 1, "llm": 2}, {"vision": 0, "llm": 1}]


def test_static_memory_in_any_unit_replicas_central_and_frozen():
    regions = [{"name": "vision", "layers": 2, "trainable": True}, {"name": "llm", "layers": 4, "trainable": True}]
    prof = parse_profile({"regions": regions})
    size = {("vision", 0): 1000, ("llm", 0): 300, ("llm", 1): 500}   # bytes of each chunk's parameters
    plan = derive(prof, "transpose", 2, 4)
    assert static_memory(plan, lambda r, c: size[(r, c)], 2.0) == {0: (1300, 1300, 2600), 1: (1500, 1500, 3000)}
    plan = derive(prof, "transpose(backward=central)", 2, 4)
    assert static_memory(plan, lambda r, c: size[(r, c)], 2.0) == {0: (1300, 1300, 2600), 1: (1500, 500, 1000)}
    regions[0]["trainable"] = False
    plan = derive(parse_profile({"regions": regions}), "transpose", 2, 4)
    assert static_memory(plan, lambda r, c: size[(r, c)], 1.0) == {0: (1300, 300, 300), 1: (1500, 500, 500)}


def test_simulate_json_devices_carry_the_parts_and_held_forwards(cli):
    import json
    r = cli("simulate", recipe("tiny_mllm.yaml"), "--json")
    assert r.returncode == 0, r.stderr
    d0 = json.loads(r.stdout)["devices"][0]
    assert d0["peak_held"] == {"vision": 2, "llm": 2} and d0["peak_held_total"] == 4
    # 2 encoder layers + 2 LLM layers of 0.1 MB; grads as many; Adam 2x
    assert (d0["params_mb"], d0["grads_mb"], d0["optimizer_mb"]) == pytest.approx((0.4, 0.4, 0.8))
