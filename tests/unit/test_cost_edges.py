"""Cost-model edges a mutation run (docs/mutation.md) showed unchecked: the report's JSON, the ring formulas at
their limits, a collective's bytes, the per-action work multiplier, a chunk table out of order, a plan silent on
``trainable``, sharded optimizer state and sub-millisecond steps. Every figure is derived by hand here."""
import dataclasses

import pytest

from hyperparallel.mpipe import check, derive, parse_profile
from hyperparallel.mpipe.cost import CostReport, DeviceCost, Durations, ring_ms, simulate, static_memory
from hyperparallel.errors import SpecError
from hyperparallel.mpipe.ir import ALLGATHER, ALLREDUCE, BROADCAST, F, RECV, WGRAD, Action
from hyperparallel.mpipe.profile import LinkProfile

P, M = 2, 3


def _llm(f=1.0, b=2.0, w=0.5, **top):
    regions = [{"name": "llm", "layers": P, "trainable": True, "forward_ms": f, "backward_ms": b,
                "weight_ms": w, "activation_mb": 1.0, "param_mb": 1.0}]
    return parse_profile(dict({"regions": regions}, **top))


def _plan(prof, schedule="1f1b", D=1):
    plan = derive(prof, schedule, P, M, 1, D)
    assert check(plan) == []
    return plan


# -- the report's JSON -------------------------------------------------------------------------------------------

def test_report_json_rounds_to_six_places_and_names_every_field():
    dev = DeviceCost(1, busy_ms=1.2345674, peak_activation_mb=2.0000007, peak_memory_mb=3.5000004,
                     static_memory_mb=9.0, params_mb=4.1234561, grads_mb=0.5000004, optimizer_mb=1.2500003,
                     peak_held={"llm": 2}, peak_held_total=3)
    rep = CostReport(makespan_ms=10.1234562, step_ms=7.2500004, bubble_ratio=0.2500008, devices=[dev])
    out = rep.to_json()
    assert out == {"makespan_ms": 10.123456, "step_ms": 7.25, "bubble_ratio": 0.250001,
                   "devices": [{"device": 1, "busy_ms": 1.234567, "peak_activation_mb": 2.000001,
                                "peak_memory_mb": 3.5, "params_mb": 4.123456, "grads_mb": 0.5, "optimizer_mb": 1.25,
                                "peak_held": {"llm": 2}, "peak_held_total": 3}]}
    # a seventh decimal below 5 everywhere: rounding to 7 places or to a whole number would show
    assert out["devices"][0]["peak_held"] is not dev.peak_held   # a copy: editing the JSON leaves the report


# -- ring collectives: 4 members, 2048 MB at 2 GB/s is 1000 ms of bytes, 0.5 ms per hop --------------------------

LINK = LinkProfile(latency_ms=0.5, bandwidth_gb_s=2.0)


@pytest.mark.parametrize("kind, ms", [(ALLREDUCE, 2 * 3 * 0.5 + 2 * 3 / 4 * 1000.0),
                                      (ALLGATHER, 3 * 0.5 + 3 / 4 * 1000.0),
                                      ("GATHER", 3 * 0.5 + 3 / 4 * 1000.0),
                                      (BROADCAST, 3 * 0.5 + 1000.0)])
def test_ring_formulas(kind, ms):
    assert ring_ms(kind, 4, 2048.0, LINK) == pytest.approx(ms)


def test_ring_of_one_member_or_a_free_link_costs_nothing():
    # a broadcast's formula would give one full transfer for g = 1; a lone member sends nothing
    assert ring_ms(BROADCAST, 1, 2048.0, LINK) == 0.0
    assert ring_ms(BROADCAST, 4, 2048.0, LinkProfile(latency_ms=0.5, bandwidth_gb_s=0.0)) == 0.0


def test_ring_of_an_unknown_kind_is_refused_by_name():
    with pytest.raises(ValueError) as e:
        ring_ms("SCATTER", 4, 1.0, LINK)
    assert str(e.value) == "no ring formula for 'SCATTER'"


def test_only_sends_and_collectives_take_link_time():
    prof = _llm(link={"latency_ms": 0.5, "bandwidth_gb_s": 2.0})
    dur = Durations(_plan(prof), prof)
    assert dur.comm(Action(RECV, "llm", 0, 0, peer=0, tensor="act")) == 0.0


def test_a_plan_collective_moves_the_whole_region():
    # the trained encoder's replicas all-reduce its 2 layers x 100 MB: 200 MB over 2 members at 1 GB/s, no latency
    regions = [{"name": "vision", "layers": 2, "trainable": True, "param_mb": 100.0},
               {"name": "llm", "layers": 4, "trainable": True, "param_mb": 10.0}]
    prof = parse_profile({"regions": regions, "link": {"latency_ms": 0.0, "bandwidth_gb_s": 1.0}})
    dur = Durations(derive(prof, "transpose", P, 4), prof)
    a = Action(ALLREDUCE, "vision", tensor=WGRAD, group=(0, 1))
    assert dur.comm(a) == pytest.approx(2 * 1 / 2 * 200.0 / 1024.0 * 1000.0)


# -- compute time --------------------------------------------------------------------------------------------------

def test_work_multiplier_scales_compute_but_not_the_action_overhead():
    # F runs twice its work: (1.0 x 2) + 0.1 = 2.1 ms; BW (2.5 x 1) + 0.1 = 2.6 ms; 1F1B: (M + P - 1) slots
    prof = _llm(action_overhead_ms=0.1)
    rep = simulate(_plan(prof), prof, work=lambda a: 2.0 if a.kind == F else 1.0)
    assert rep.step_ms == pytest.approx((M + P - 1) * (2.1 + 2.6))


def test_chunk_table_order_does_not_move_the_head():
    # the head's extra forward time goes to the chunk that stops at the region's last layer, whatever the
    # order of the chunk table
    prof = parse_profile({"regions": [{"name": "llm", "layers": P, "trainable": True, "forward_ms": 1.0,
                                       "head_forward_ms": 0.5}]})
    plan = _plan(prof)
    plan = dataclasses.replace(plan, chunks=list(reversed(plan.chunks)))
    assert check(plan) == []
    dur = Durations(plan, prof)
    assert [dur.compute(Action(F, "llm", c, 0)) for c in (0, 1)] == [1.0, 1.5]


def test_device_scale_of_another_length_is_refused():
    prof = _llm(device_scale=[1.0, 1.0, 1.0])
    with pytest.raises(SpecError) as e:
        simulate(_plan(prof), prof)
    assert str(e.value) == ("mpipe.profile.device_scale: has 3 entries but the plan has 2 pipeline devices "
                            "(one per device, or leave it out)")


def test_sub_millisecond_step_keeps_its_bubble_and_memory():
    # f = 0.05, b = 0.1, w = 0.025 ms: a step of 4 slots of 0.175 ms = 0.7 ms; the 1F1B bubble (P-1)/(M+P-1);
    # device 0 holds P = 2 forwards at most, device 1 one (1 MB each: one layer per chunk)
    prof = _llm(0.05, 0.1, 0.025)
    rep = simulate(_plan(prof), prof)
    assert rep.step_ms == pytest.approx(0.7)
    assert rep.bubble_ratio == pytest.approx((P - 1) / (M + P - 1))
    assert [d.peak_activation_mb for d in rep.devices] == [2.0, 1.0]
    assert [d.peak_held_total for d in rep.devices] == [2, 1]


def test_zero_time_step_is_all_bubble():
    prof = _llm(0.0, 0.0, 0.0)
    rep = simulate(_plan(prof), prof)
    assert rep.step_ms == 0.0
    assert rep.bubble_ratio == 1.0


# -- static memory ---------------------------------------------------------------------------------------------

def test_plan_silent_on_trainable_counts_every_region_as_trained():
    # 1F1B, P = 2, one 1 MB layer per device; without a trainable table every chunk keeps grads and optimizer state
    prof = _llm(link={"latency_ms": 0.0, "bandwidth_gb_s": 1.0})
    plan = dataclasses.replace(_plan(prof, D=2), trainable={})
    assert static_memory(plan, lambda r, c: 10.0, 2.0) == {0: (10.0, 10.0, 20.0), 1: (10.0, 10.0, 20.0)}
    assert Durations(plan, prof).held_param_mb(0, trainable_only=True) == 1.0


def test_sharded_optimizer_state_is_split_over_the_replicas():
    # transpose(optimizer=sharded), P = 2: both devices hold the 100 MB encoder and keep half its optimizer state
    # (x 2); each holds its own LLM chunks (10 MB per chunk) whole
    regions = [{"name": "vision", "layers": 1, "trainable": True}, {"name": "llm", "layers": 4, "trainable": True}]
    prof = parse_profile({"regions": regions})
    plan = derive(prof, "transpose(optimizer=sharded)", P, 4)
    assert check(plan) == []
    mem = static_memory(plan, lambda r, c: 100.0 if r == "vision" else 10.0, 2.0)
    for d in range(P):
        n = sum(1 for c in plan.chunks_on(d) if c.region == "llm")
        assert n >= 1
        assert mem[d] == (100.0 + 10.0 * n, 100.0 + 10.0 * n, (50.0 + 10.0 * n) * 2.0)


# -- tied weights and the data-parallel bytes ------------------------------------------------------------------

def _tied(llm_trainable: bool):
    from hyperparallel.mpipe.profile import TiedWeight
    regions = [{"name": "llm", "layers": 4, "trainable": llm_trainable, "param_mb": 10.0}]
    prof = parse_profile({"regions": regions, "link": {"latency_ms": 0.0, "bandwidth_gb_s": 1.0}})
    prof = dataclasses.replace(prof, tied=(TiedWeight("embed", "llm", (0, 3), 64.0),))
    plan = derive(prof, "1f1b", P, 4, 1, 2)
    assert check(plan) == [] and [t.devices for t in plan.tied] == [(0, 1)]
    return plan, prof


def test_held_parameters_count_the_tied_copy_of_trained_regions_only_for_gradients():
    # 1F1B, P = 2: each device holds two 10 MB LLM layers and a 64 MB copy of the tied embedding
    plan, prof = _tied(True)
    dur = Durations(plan, prof)
    assert [dur.held_param_mb(d) for d in (0, 1)] == [84.0, 84.0]
    assert [dur.held_param_mb(d, trainable_only=True) for d in (0, 1)] == [84.0, 84.0]
    frozen, fprof = _tied(False)
    fdur = Durations(frozen, fprof)
    assert [fdur.held_param_mb(d) for d in (0, 1)] == [84.0, 84.0]          # parameters held all the same
    assert [fdur.held_param_mb(d, trainable_only=True) for d in (0, 1)] == [0.0, 0.0]
    silent = Durations(dataclasses.replace(plan, trainable={}), prof)        # no table: trained
    assert silent.held_param_mb(0, trainable_only=True) == 84.0


def test_tied_copy_of_a_frozen_region_holds_no_gradient_or_optimizer_state():
    from hyperparallel.mpipe.cost import tied_memory
    frozen, _ = _tied(False)
    assert tied_memory(frozen, lambda name: 64.0, 2.0) == {0: (64.0, 0.0, 0.0), 1: (64.0, 0.0, 0.0)}
    plan, _ = _tied(True)
    assert tied_memory(dataclasses.replace(plan, trainable={}), lambda name: 64.0, 2.0) == \
        {0: (64.0, 64.0, 128.0), 1: (64.0, 64.0, 128.0)}


def test_data_parallel_allreduce_defaults_to_device_0s_bytes():
    # 1F1B, D = 2, a trained 100 MB encoder on device 0 beside two 10 MB LLM layers, two LLM layers on device 1:
    # without a device the all-reduce is costed with device 0's 120 MB (2 members, 1 GB/s: 120 MB / 1 GB/s)
    from hyperparallel.mpipe.ir import DP_GROUP
    regions = [{"name": "vision", "layers": 1, "trainable": True, "param_mb": 100.0},
               {"name": "llm", "layers": 4, "trainable": True, "param_mb": 10.0}]
    prof = parse_profile({"regions": regions, "link": {"latency_ms": 0.0, "bandwidth_gb_s": 1.0}})
    dur = Durations(_plan(prof, D=2), prof)
    a = Action(ALLREDUCE, "llm", tensor=WGRAD, group=DP_GROUP)
    assert dur.comm(a) == pytest.approx(120.0 / 1024.0 * 1000.0)
    assert dur.comm(a, 1) == pytest.approx(20.0 / 1024.0 * 1000.0)


def test_frozen_forward_holds_one_layer_while_it_runs():
    # a frozen 2-layer encoder (3 MB per layer) with nothing trained before it stashes nothing: its forward needs
    # one layer's 3 MB while it runs; the LLM keeps no activations (0 MB), so 3 MB is every such device's peak
    regions = [{"name": "vision", "layers": 2, "trainable": False, "activation_mb": 3.0},
               {"name": "llm", "layers": 4, "trainable": True, "activation_mb": 0.0}]
    prof = parse_profile({"regions": regions})
    plan = derive(prof, "transpose", P, 4)
    assert check(plan) == []
    rep = simulate(plan, prof)
    runs = [d for d in range(P) if any(t.action.kind == F and t.action.region == "vision"
                                       for t in rep.execution.timeline[d])]
    assert runs
    assert [rep.devices[d].peak_activation_mb for d in runs] == [3.0] * len(runs)


def test_tied_weight_missing_from_the_profile_weighs_nothing():
    # the plan ties an embedding the profile gives no size: each device holds only its two 10 MB LLM layers
    plan, prof = _tied(True)
    dur = Durations(plan, dataclasses.replace(prof, tied=()))
    assert dur.tied_mb("embed") == 0.0
    assert [dur.held_param_mb(d) for d in (0, 1)] == [20.0, 20.0]


def test_tied_allreduce_moves_only_the_tied_weights_of_its_own_group():
    # a second tied weight of the LLM held on device 0 alone is not summed by the all-reduce over (0, 1):
    # 64 MB over 2 members at 1 GB/s, no latency
    from hyperparallel.mpipe.ir import TIED
    from hyperparallel.mpipe.profile import TiedWeight
    plan, prof = _tied(True)
    plan = dataclasses.replace(plan, tied=plan.tied + [dataclasses.replace(plan.tied[0], name="lone", devices=(0,))])
    prof = dataclasses.replace(prof, tied=prof.tied + (TiedWeight("lone", "llm", (0, 0), 32.0),))
    a = Action(ALLREDUCE, "llm", tensor=TIED, group=(0, 1))
    assert Durations(plan, prof).comm(a) == pytest.approx(64.0 / 1024.0 * 1000.0)
