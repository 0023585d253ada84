"""Cost model: closed forms of the design doc (section 6), memory, link model, balanced owners and spill."""
import pytest

from hyperparallel.mpipe import Plan, check, derive, parse_profile
from hyperparallel.recipe import derive_recipe, load_recipe
from hyperparallel.mpipe.cost import ring_ms, simulate
from hyperparallel.mpipe.ir import ALLREDUCE, BROADCAST, F
from hyperparallel.mpipe.profile import LinkProfile
from hyperparallel.errors import SpecError
from hyperparallel.mpipe.orders import ORDERS, validate

from helpers import recipe
from helpers import profile

# per-chunk times: two layers per chunk, so the per-layer numbers are half of these
f, b, w = 1.0, 2.0, 0.5
ACT_MB = 2.0  # activation per chunk and micro-batch (1 MB per layer, 2 layers)


def llm(P, V, ff=f, bb=b, ww=w):
    return profile(("llm", 2 * P * V, True, ff / 2, bb / 2, ww / 2))


def run(prof, schedule, P, M, V=1, steps=1):
    plan = derive(prof, schedule, P, M, V)
    assert check(plan) == []
    return plan, simulate(plan, prof, steps=steps)


SHAPES_1 = [(1, 3), (2, 4), (3, 7), (4, 4), (4, 8), (5, 3), (8, 16), (6, 13)]


@pytest.mark.parametrize("P,M", SHAPES_1)
@pytest.mark.parametrize("order", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_makespan_closed_form(order, P, M):
    _, rep = run(llm(P, 1), order, P, M)
    assert rep.makespan_ms == pytest.approx((M + P - 1) * (f + b + w), abs=1e-9)
    busy = M * (f + b + w)
    assert all(d.busy_ms == pytest.approx(busy) for d in rep.devices)
    assert rep.bubble_ratio == pytest.approx(1 - busy / rep.makespan_ms)


@pytest.mark.parametrize("P,M,V", [(2, 4, 2), (4, 8, 2), (4, 4, 2), (4, 12, 3), (8, 16, 2), (3, 9, 4), (2, 2, 3)])
def test_interleaved_makespan_closed_form(P, M, V):
    _, rep = run(llm(P, V), "interleaved", P, M, V)
    assert rep.makespan_ms == pytest.approx(V * M * (f + b + w) + (P - 1) * (f + b + w), abs=1e-9)


@pytest.mark.parametrize("P,M", SHAPES_1)
def test_peak_activations_1f1b_min_p_minus_s_m_and_gpipe_m(P, M):
    _, r1 = run(llm(P, 1), "1f1b", P, M)
    _, rg = run(llm(P, 1), "gpipe", P, M)
    for s in range(P):
        assert r1.devices[s].peak_activation_mb == pytest.approx(min(P - s, M) * ACT_MB)
        assert rg.devices[s].peak_activation_mb == pytest.approx(M * ACT_MB)


ZB_COSTS = [(1.0, 2.0, 0.5), (1.0, 1.0, 0.5), (1.0, 1.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.0, 2.0), (0.5, 1.0, 1.5)]


@pytest.mark.parametrize("ff,bb,ww", ZB_COSTS)
@pytest.mark.parametrize("P,M", [(2, 4), (3, 7), (4, 8), (4, 4), (8, 16), (6, 13), (5, 3), (3, 2)])
def test_zb_h1_paper_closed_form_peak_p_and_never_slower_than_1f1b(P, M, ff, bb, ww):
    _, r1 = run(llm(P, 1, ff, bb, ww), "1f1b", P, M)
    _, rz = run(llm(P, 1, ff, bb, ww), "zb_h1", P, M)
    if M >= P:
        # the zero-bubble paper's ZB-H1: bubble (P-1)(f+b-w) for w <= f; with w > f device 0 still
        # waits (P-1)b for its first input grad (it may hold only P micro-batches), so (P-1)b
        assert rz.makespan_ms == pytest.approx(M * (ff + bb + ww) + (P - 1) * (ff + bb - min(ff, ww)), abs=1e-9)
    assert rz.makespan_ms <= r1.makespan_ms + 1e-9
    if ww > 0 and M >= 2:
        assert rz.makespan_ms < r1.makespan_ms - 1e-9
    # at most P micro-batches of activations on every device (1F1B's peak, on its device 0)
    assert max(d.peak_activation_mb for d in rz.devices) <= min(P, M) * ACT_MB + 1e-9


def test_zb_h1_without_weight_grad_is_1f1b():
    for P, M in [(2, 4), (4, 8), (5, 3)]:
        _, r1 = run(llm(P, 1, ww=0.0), "1f1b", P, M)
        _, rz = run(llm(P, 1, ww=0.0), "zb_h1", P, M)
        assert rz.makespan_ms == pytest.approx(r1.makespan_ms)


# torch.distributed.pipelining under the same list scheduling, free communication, per-chunk
# f = 1, b = 1, w = 0.5, P = 4, M = 8, V = 2 (the figures of issue 11): upper bounds
TORCH_P4_M8_V2 = {"interleaved": 47.5, "interleaved_zb": 44.5, "zbv": 43.0, "dualpipev": 44.5}


@pytest.mark.parametrize("order", sorted(TORCH_P4_M8_V2))
def test_v2_orders_at_least_as_fast_as_torch(order):
    P, M, V = 4, 8, 2
    plan, rep = run(llm(P, V, 1.0, 1.0, 0.5), order, P, M, V)
    assert rep.makespan_ms <= TORCH_P4_M8_V2[order] + 1e-9
    assert rep.makespan_ms >= V * M * 2.5 - 1e-9  # no device idles less than never
    peaks = [d.peak_activation_mb / ACT_MB for d in rep.devices]
    if order in ("zbv", "dualpipev"):
        # V-shape: chunk c on device c, then 2P-1-c; at most 2P+1 chunk activations per device
        assert [c.devices[0] for c in plan.chunks] == [0, 1, 2, 3, 3, 2, 1, 0]
        assert max(peaks) <= 2 * P + 1
    else:
        assert [c.devices[0] for c in plan.chunks] == [0, 1, 2, 3, 0, 1, 2, 3]


@pytest.mark.parametrize("P,M", [(2, 3), (4, 8), (4, 16), (8, 16), (3, 9)])
def test_zbv_closed_form_and_beats_interleaved(P, M):
    # ZB-V on DualPipeV's F/B order with W in the bubbles: 2M(f+b+w) + (P-1)(f+b-2w) here
    _, rz = run(llm(P, 2, 1.0, 1.0, 0.5), "zbv", P, M, 2)
    assert rz.makespan_ms == pytest.approx(2 * M * 2.5 + (P - 1) * 1.0)
    _, ri = run(llm(P, 2, 1.0, 1.0, 0.5), "interleaved", P, M, 2) if M >= P else (None, rz)
    assert rz.makespan_ms <= ri.makespan_ms + 1e-9


def test_dualpipev_pairs_forward_and_backward_of_different_micro_batches():
    plan, _ = run(llm(4, 2), "dualpipev", 4, 8, 2)
    assert Plan.loads(plan.dumps()).programs == plan.programs  # the pairs travel with the plan JSON
    for d, prog in plan.programs.items():
        pairs = {}
        for a in prog:
            if a.pair is not None:
                pairs.setdefault(a.pair, []).append(a)
        assert pairs, f"device {d}"
        for members in pairs.values():
            f_, b_ = members
            assert (f_.kind, b_.kind) == ("F", "B") and f_.micro != b_.micro and f_.chunk != b_.chunk
    assert not any(a.pair is not None for p in run(llm(4, 2), "zbv", 4, 8, 2)[0].programs.values() for a in p)


@pytest.mark.parametrize("M,expect", [(6, 37.5), (8, 47.5), (10, 57.5), (5, 32.5), (7, 42.5)])
def test_interleaved_any_m_at_least_p_closed_form(M, expect):
    # torch: P=4, V=2, M=6 -> 37.5, M=10 -> 57.5 (f+b+w = 2.5 per chunk); V*M*(f+b+w) + (P-1)(f+b+w)
    _, rep = run(llm(4, 2, 1.0, 1.0, 0.5), "interleaved", 4, M, 2)
    assert rep.makespan_ms == pytest.approx(expect) == 2 * M * 2.5 + 3 * 2.5


def test_interleaved_at_m_equals_p_holds_no_more_than_torch():
    # torch's interleaved 1F1B at P=4, V=2, M=4 holds 7 and 5 micro-batch chunks on ranks 2 and 3
    _, rep = run(llm(4, 2), "interleaved", 4, 4, 2)
    peaks = [d.peak_activation_mb / ACT_MB for d in rep.devices]
    assert peaks[2] <= 7 and peaks[3] <= 5 and max(peaks) <= 8


def test_static_memory_counts_params_grads_optimizer_and_encoder_replicas():
    regions = [{"name": "vision", "layers": 2, "trainable": True, "param_mb": 10.0, "activation_mb": 0.0},
               {"name": "llm", "layers": 4, "trainable": True, "param_mb": 5.0, "activation_mb": 0.0}]
    prof = parse_profile({"regions": regions, "optimizer_factor": 2.0})
    # trained encoder replica on every device: 20 MB params + grads + 2x optimizer state = 80 MB
    _, rep = run(prof, "transpose", 2, 2)
    assert [d.peak_memory_mb for d in rep.devices] == pytest.approx([80 + 40, 80 + 40])
    # central backward: replicas hold only parameters, device 0 holds grads and optimizer state
    _, rep = run(prof, "transpose(backward=central)", 2, 2)
    assert [d.peak_memory_mb for d in rep.devices] == pytest.approx([80 + 40, 20 + 40])
    # frozen encoder placed on device 0: parameters only
    regions[0]["trainable"] = False
    prof = parse_profile({"regions": regions})
    _, rep = run(prof, "1f1b", 2, 2)
    assert [d.peak_memory_mb for d in rep.devices] == pytest.approx([20 + 40, 40])


def test_link_model_send_latency_plus_bytes_over_bandwidth():
    # 2 devices, 1 micro-batch, forward only chain: F(d0), SEND 1 MB, F(d1), then backward back
    link = {"latency_ms": 0.5, "bandwidth_gb_s": 1.0}
    prof = profile(("llm", 2, True, 1.0, 1.0, 0.0), link=link)
    _, rep = run(prof, "1f1b", 2, 1)
    hop = 0.5 + 1.0 / 1024.0 * 1000.0
    assert rep.makespan_ms == pytest.approx(4 * 1.0 + 2 * hop)


def test_ring_collective_formulas():
    link = LinkProfile(latency_ms=0.1, bandwidth_gb_s=1.0)
    full = 1024.0 / 1024.0 * 1000.0  # 1024 MB at 1 GB/s
    assert ring_ms(ALLREDUCE, 4, 1024.0, link) == pytest.approx(6 * 0.1 + 2 * 3 / 4 * full)
    assert ring_ms("ALLGATHER", 4, 1024.0, link) == pytest.approx(3 * 0.1 + 3 / 4 * full)
    assert ring_ms(BROADCAST, 4, 1024.0, link) == pytest.approx(3 * 0.1 + full)
    assert ring_ms(ALLREDUCE, 1, 1024.0, link) == 0.0
    assert ring_ms(ALLREDUCE, 4, 1024.0, LinkProfile()) == 0.0


def test_trained_transposed_encoder_pays_its_allreduce():
    link = {"latency_ms": 0.0, "bandwidth_gb_s": 1.0}
    regions = [{"name": "vision", "layers": 1, "trainable": True, "param_mb": 100.0, "forward_ms": 1.0},
               {"name": "llm", "layers": 2, "trainable": True, "forward_ms": 1.0}]
    prof = parse_profile({"regions": regions, "link": link})
    plan, rep = run(prof, "transpose", 2, 2)
    ar = [t for t in rep.execution.timeline[0] if t.action.kind == ALLREDUCE]
    assert len(ar) == 1 and ar[0].end - ar[0].start == pytest.approx(2 * 1 / 2 * 100.0 / 1024 * 1000)


def test_transpose_beats_encoder_on_device_0_on_the_encoder_heavy_recipe():
    rec = load_recipe(recipe("mllm_encoder_heavy.yaml"))
    base = simulate(derive_recipe(rec, "1f1b"), rec.profile).makespan_ms
    tr = simulate(derive_recipe(rec, "transpose"), rec.profile).makespan_ms
    assert tr < 0.7 * base


def _frozen_vit(schedule, steps=3, **over):
    rec = load_recipe(recipe("mllm_frozen_vit.yaml"), [f"{k}={v}" for k, v in over.items()])
    plan = derive_recipe(rec, schedule)
    assert check(plan) == []
    return plan, simulate(plan, rec.profile, steps=steps)


def test_balanced_and_spill_each_beat_round_robin_when_encoder_work_exceeds_warmup_slack():
    _, rr = _frozen_vit("transpose")
    plan_b, bal = _frozen_vit("transpose(owners=balanced)")
    plan_s, spill = _frozen_vit("transpose(spill=next_step)")
    _, both = _frozen_vit("transpose(owners=balanced, spill=next_step)")
    assert bal.makespan_ms < rr.makespan_ms - 1.0
    assert spill.makespan_ms < rr.makespan_ms - 1.0
    assert both.makespan_ms <= spill.makespan_ms + 1e-9
    # balanced gives device 0 (least slack) the fewest micro-batches, the last device the most
    counts = [plan_b.meta["owners"]["vision"].count(d) for d in range(4)]
    assert counts[0] == min(counts) and counts[-1] == max(counts) and counts[0] < counts[-1]
    # spill: device 0's spilled forwards run in its bubble before the first backward, not after it
    prog0 = [a for a in plan_s.programs[0] if a.is_compute]
    first_bwd = next(i for i, a in enumerate(prog0) if a.region == "llm" and a.kind != F)
    assert any(a.region == "vision" and a.step == 1 for a in prog0[:first_bwd])


def test_spill_with_free_communication_reaches_the_plain_llm_step():
    free = {"mpipe.profile.link.bandwidth_gb_s": 0}
    _, spill = _frozen_vit("transpose(spill=next_step)", **free)
    # the LLM alone: 1F1B closed form (M + P - 1)(f + b + w) with f = b = w = 2 ms per chunk
    assert spill.makespan_ms == pytest.approx((8 + 4 - 1) * 6.0)


def test_spill_is_steady_state_and_round_robin_transpose_is_step_invariant():
    _, one = _frozen_vit("transpose", steps=1)
    _, three = _frozen_vit("transpose", steps=3)
    assert one.makespan_ms == pytest.approx(three.makespan_ms)


def test_balanced_spreads_round_robin_when_encoder_dwarfs_slack():
    # E = 12 ms >> d * f: the best counts are the even ones
    rec = load_recipe(recipe("mllm_encoder_heavy.yaml"))
    plan = derive_recipe(rec, "transpose(owners=balanced)")
    assert sorted(plan.meta["owners"]["vision"].count(d) for d in range(4)) == [2, 2, 2, 2]


def test_data_parallel_allreduce_costed_with_each_devices_own_parameter_bytes():
    """Uneven cut (3 + 1 layers of 10 MB) and D=2: each device's gradient all-reduce moves its own bytes."""
    prof = parse_profile({"link": {"latency_ms": 0.1, "bandwidth_gb_s": 1.0}, "regions": [
        {"name": "llm", "layers": 4, "trainable": True, "forward_ms": 1.0, "backward_ms": 1.0, "param_mb": 10.0}]})
    sched = [{"region": "llm", "skeleton": "pipe", "order": "1f1b", "layers": [3, 1]}]
    plan = derive(prof, sched, 2, 4, 1, 2)
    assert check(plan) == []
    rep = simulate(plan, prof)
    took = {d: [t.end - t.start for t in rep.execution.timeline[d] if t.action.kind == ALLREDUCE]
            for d in (0, 1)}
    assert took[0] == [pytest.approx(ring_ms(ALLREDUCE, 2, 30.0, prof.link))]
    assert took[1] == [pytest.approx(ring_ms(ALLREDUCE, 2, 10.0, prof.link))]
    assert took[0][0] > 2 * took[1][0]


def test_head_cost_on_the_last_chunk_and_device_scale():
    """A region's head runs once, on the chunk holding its last layer; device_scale multiplies every
    compute duration of a device (cores of unequal speed); the counts are exact."""
    from hyperparallel.mpipe.derive import derive
    from hyperparallel.mpipe.profile import parse_profile
    from hyperparallel.mpipe.cost import simulate
    block = {"regions": [{"name": "llm", "layers": 2, "forward_ms": 1.0, "backward_ms": 1.0, "weight_ms": 0.0,
                          "head_forward_ms": 5.0, "head_backward_ms": 2.0}]}
    plan = derive(parse_profile(block), "gpipe", P=2, M=1)
    # device 0: F 1, device 1: F 1 + 5, BW 1 + 2, device 0: BW 1 (free communication)
    assert simulate(plan, parse_profile(block)).step_ms == pytest.approx(1 + 6 + 3 + 1)
    scaled = parse_profile(dict(block, device_scale=[1.0, 2.0]))
    assert simulate(plan, scaled).step_ms == pytest.approx(1 + 12 + 6 + 1)
    three = parse_profile(dict(block, device_scale=[1.0, 2.0, 1.0]))
    with pytest.raises(SpecError, match="device_scale"):
        simulate(plan, three)
    with pytest.raises(SpecError, match=r"device_scale\[1\]"):
        parse_profile(dict(block, device_scale=[1.0, 0.0]))


# -- the order registry's closed forms, every order that has one ----------------------------------
REGISTRY_SHAPES = [(2, 1, 4), (4, 1, 8), (3, 1, 7), (2, 2, 4), (4, 2, 8), (4, 2, 12), (3, 3, 9), (2, 2, 3)]


@pytest.mark.parametrize("ff,bb,ww", [(1.0, 1.0, 0.5), (1.0, 2.0, 0.5), (2.0, 1.0, 1.0), (1.0, 1.0, 0.0)])
@pytest.mark.parametrize("name", [n for n, o in ORDERS.items() if o.closed_form is not None])
def test_registry_closed_forms_are_the_simulated_makespans(name, ff, bb, ww):
    order, checked = ORDERS[name], 0
    for P, V, M in REGISTRY_SHAPES:
        try:
            validate(name, P, V, M)
        except SpecError:
            continue
        want = order.closed_form(P, V, M, ff, bb, ww)
        if want is None:
            continue
        _, rep = run(llm(P, V, ff, bb, ww), name, P, M, V)
        assert rep.makespan_ms == pytest.approx(want, abs=1e-9), (name, P, V, M)
        checked += 1
    if order.placement != "vshape" or (ff == bb and ww in (0, ff / 2)):
        assert checked > 0, name   # every closed form is exercised somewhere


def test_every_order_has_one_registry_entry_read_everywhere():
    """The schedule parser, MindFormers' scheduler keys and the graph-mode mapping read the registry."""
    from hyperparallel.mpipe.schedule import SHORT_NAMES
    from hyperparallel.mpipe.orders import for_scheduler
    assert set(ORDERS) <= set(SHORT_NAMES)
    for name, o in ORDERS.items():
        if o.mindspore:   # the MindSpore scheduler maps back to this order at a V the order runs with
            V = o.V or (1 if name == "gpipe" else 2)
            assert for_scheduler(o.mindspore[0], V).name == name, name
