"""The checker's negative side: one valid plan broken in exactly one way per rule, refused with that rule's
message. Every finding ``check`` can emit has a test here (a planted bug that silences a rule fails one)."""
import dataclasses

import pytest

from hyperparallel.mpipe import Action, Plan, check, derive
from hyperparallel.errors import PlanError
from hyperparallel.mpipe.check import (check_chunks, check_collectives, check_completeness, check_deadlock, check_tied,
                                       check_dependencies, check_fifo, check_structure, _Structure)
from hyperparallel.mpipe.execute import execute
from hyperparallel.mpipe.ir import ALLREDUCE, B, BW, F, GRAD, R, RECV, SEND, W, WGRAD

from helpers import mllm, profile


def _1f1b(P=2, M=3, layers=4):
    return derive(profile(("llm", layers, True)), "1f1b", P, M)


def _transpose(backward="owner", trained=True, P=2, M=4):
    return derive(mllm(trained), f"transpose(backward={backward})", P, M)


def _zb(P=2, M=3):
    return derive(profile(("llm", 4, True)), "zb_h1", P, M)


def _index(prog, pred):
    return next(i for i, a in enumerate(prog) if pred(a))


def _only(errs, text):
    """The plan is refused, and the first finding is the one this test planted."""
    assert errs, "the broken plan must be refused"
    assert text in errs[0], errs
    return errs[0]


@pytest.mark.parametrize("make", [_1f1b, _zb, lambda: _transpose("owner"), lambda: _transpose("central"),
                                  lambda: _transpose("owner", trained=False)])
def test_every_base_plan_is_valid(make):
    assert check(make()) == []


# -- the chunk table ------------------------------------------------------------------------------------------

def test_chunk_indices_not_once_each():
    plan = _1f1b()
    plan.chunks[1] = dataclasses.replace(plan.chunks[1], index=0)
    msg = _only(check(plan), "chunks of region 'llm': indices [0, 0] are not 0..1 once each")
    assert msg == check_chunks(plan)[0]


def test_chunk_with_empty_layer_range():
    plan = _1f1b()
    c = plan.chunks[0]
    plan.chunks[0] = dataclasses.replace(c, stop=c.start)
    _only(check(plan), f"chunk 0 of region 'llm': empty layer range {c.start}..{c.start}")


def test_chunk_held_by_no_device_of_the_plan():
    plan = _1f1b()
    plan.chunks[1] = dataclasses.replace(plan.chunks[1], devices=(5,))
    _only(check(plan), "chunk 1 of region 'llm': holders [5] not among devices 0..1")


def test_chunk_leaves_a_gap_in_the_layers():
    plan = _1f1b()
    c = plan.chunks[1]
    plan.chunks[1] = dataclasses.replace(c, start=c.start + 1)
    _only(check(plan), f"chunk 1 of region 'llm' starts at layer {c.start + 1}, not where chunk 0 stops "
                       f"({plan.chunks[0].stop})")


# -- structure ------------------------------------------------------------------------------------------------

def test_program_for_a_device_outside_the_plan():
    plan = _1f1b()
    plan.programs[2] = []
    _only(check(plan), "device 2: program for a device outside 0..1")


def test_unknown_action_kind():
    plan = _1f1b()
    plan.programs[0].insert(0, Action("FLY"))
    _only(check(plan), "device 0 action 0 (")
    assert "unknown kind" in check(plan)[0]


def test_compute_on_an_unknown_chunk():
    plan = _1f1b()
    prog = plan.programs[0]
    k = _index(prog, lambda a: a.kind == F)
    prog[k] = dataclasses.replace(prog[k], chunk=7)
    assert f"device 0 action {k}" in _only(check(plan), "unknown region/chunk")


def test_compute_on_a_chunk_the_device_does_not_hold():
    plan = _1f1b()
    prog = plan.programs[0]
    k = _index(prog, lambda a: a.kind == F)
    prog[k] = dataclasses.replace(prog[k], chunk=1)   # chunk 1 lives on device 1
    assert f"device 0 action {k}" in _only(check(plan), "chunk is not held by device 0 (holders [1])")


def test_compute_on_a_micro_batch_outside_the_step():
    plan = _1f1b(M=3)
    prog = plan.programs[0]
    k = _index(prog, lambda a: a.kind == F)
    prog[k] = dataclasses.replace(prog[k], micro=3)
    assert f"device 0 action {k}" in _only(check(plan), "micro-batch outside 0..2")


@pytest.mark.parametrize("peer", [None, 0, 2])
def test_p2p_peer_must_be_another_device(peer):
    plan = _1f1b()
    prog = plan.programs[0]
    k = _index(prog, lambda a: a.kind == SEND)
    prog[k] = dataclasses.replace(prog[k], peer=peer)
    assert f"device 0 action {k}" in _only(check(plan), "peer must be another device in 0..1")


def test_p2p_tensor_must_be_act_or_grad():
    plan = _1f1b()
    prog = plan.programs[1]
    k = _index(prog, lambda a: a.kind == SEND)
    prog[k] = dataclasses.replace(prog[k], tensor=WGRAD)
    assert f"device 1 action {k}" in _only(check(plan), "tensor must be 'act' or 'grad'")


# -- completeness ---------------------------------------------------------------------------------------------

def test_forward_run_twice():
    plan = _1f1b()
    prog = plan.programs[0]
    k = _index(prog, lambda a: a.kind == F and a.micro == 1)
    prog.insert(k, prog[k])
    _only(check(plan), "F llm c0 m1 runs 2 times, expected once")


def test_forward_missing():
    plan = _1f1b()
    prog = plan.programs[1]
    del prog[_index(prog, lambda a: a.kind == F and a.micro == 2)]
    _only(check(plan), "F llm c1 m2 runs 0 times, expected once")


def test_trainable_backward_split_without_its_weight_grad():
    plan = _zb()
    prog = plan.programs[0]
    del prog[_index(prog, lambda a: a.kind == W and a.micro == 0)]
    _only(check(plan), "backward of llm c0 m0: 0 BW, 1 B, 0 W; expected one BW, or one B and one W (trainable)")


def test_trainable_backward_run_twice():
    plan = _1f1b()
    prog = plan.programs[1]
    k = _index(prog, lambda a: a.kind == BW and a.micro == 1)
    prog.insert(k, prog[k])
    _only(check(plan), "backward of llm c1 m1: 2 BW, 0 B, 0 W")


def test_frozen_region_with_a_weight_grad():
    # a frozen LLM chunk behind a trained encoder needs its input grad only (one B), never a weight grad
    plan = derive(profile(("vision", 2, True), ("llm", 4, False)), "1f1b", 2, 2)
    assert check(plan) == []
    d, k = next((d, i) for d, p in plan.programs.items() for i, a in enumerate(p)
                if a.region == "llm" and a.kind == B and a.micro == 0)
    plan.programs[d][k] = dataclasses.replace(plan.programs[d][k], kind=BW)
    msg = _only(check(plan), "expected one B (frozen, input grad only)")
    assert msg.startswith("backward of llm c")


def test_backward_scheduled_for_a_frozen_prefix():
    plan = _transpose("owner", trained=False)
    d, a = next((d, a) for d, p in plan.programs.items() for a in p if a.region == "vision" and a.kind == F)
    plan.programs[d].append(dataclasses.replace(a, kind=BW))
    _only(check(plan), f"backward of vision c0 m{a.micro} scheduled, but vision and everything before it is "
                       "frozen")


def test_recompute_run_twice():
    plan = _transpose("central")
    d, k = next((d, i) for d, p in plan.programs.items() for i, a in enumerate(p) if a.kind == R)
    a = plan.programs[d][k]
    plan.programs[d].insert(k, a)
    _only(check(plan), f"R vision c0 m{a.micro} runs 2 times, expected at most once")


# -- dependencies ---------------------------------------------------------------------------------------------

def test_forward_before_its_input_arrives():
    plan = _1f1b()
    prog = plan.programs[1]
    k = _index(prog, lambda a: a.kind == RECV)
    prog.append(prog.pop(k))
    _only(check(plan), f"device 1 action {k} (")
    assert "needs act of llm c0 m0, which is neither computed nor received earlier on device 1" in check(plan)[0]


def test_backward_before_its_output_grad_arrives():
    plan = _1f1b()
    prog = plan.programs[0]
    r = _index(prog, lambda a: a.kind == RECV and a.tensor == GRAD and a.micro == 0)
    b = _index(prog, lambda a: a.kind == BW and a.micro == 0)
    prog.insert(r, prog.pop(b))   # the backward now runs before the grad it needs is received
    msg = _only(check(plan), "needs grad of llm c0 m0, which is neither computed nor received")
    assert msg.startswith(f"device 0 action {r} ")


def test_backward_before_its_forward():
    plan = _1f1b()
    prog = plan.programs[1]
    b = _index(prog, lambda a: a.kind == BW and a.micro == 0)
    prog.insert(0, prog.pop(b))
    _only(check(plan), "device 1 action 0 (")
    assert "needs stash of llm c1 m0" in check(plan)[0]


def test_weight_grad_before_its_input_grad():
    plan = _zb()
    prog = plan.programs[1]
    b = _index(prog, lambda a: a.kind == B and a.micro == 0)
    w = _index(prog, lambda a: a.kind == W and a.micro == 0)
    prog.insert(b, prog.pop(w))
    msg = _only(check(plan), "needs bdone of llm c1 m0")
    assert msg.startswith(f"device 1 action {b} ")


def test_send_before_the_tensor_exists():
    plan = _1f1b()
    prog = plan.programs[0]
    s = _index(prog, lambda a: a.kind == SEND and a.micro == 0)
    prog.insert(0, prog.pop(s))
    _only(check(plan), "device 0 action 0 (")
    assert "needs act of llm c0 m0" in check(plan)[0]


# -- FIFO pairing ---------------------------------------------------------------------------------------------

def test_receive_of_a_message_never_sent():
    plan = _1f1b()
    prog = plan.programs[0]
    del prog[_index(prog, lambda a: a.kind == SEND and a.micro == 2)]
    assert check_dependencies(plan, _Structure(plan)) == []
    errs = check_fifo(plan)
    assert errs and "awaits" in errs[0] and "from device 0, which never sends it" in errs[0]
    assert errs[0] == check(plan)[0]


def test_send_of_a_message_never_received():
    plan = _1f1b()
    # device 1 also sends the activation of its last chunk, which device 0 never receives
    plan.programs[1].append(Action(SEND, "llm", 1, 0, peer=0, tensor="act"))
    assert check_dependencies(plan, _Structure(plan)) == []
    errs = check_fifo(plan)
    k = len(plan.programs[1]) - 1
    assert errs == [f"device 1 action {k} (SEND act llm c1 m0 ->0): sends ('act', 'llm', 1, 0) to device 0, "
                    "which never receives it"]


def test_fifo_order_broken_between_two_messages():
    plan = _1f1b()
    prog = plan.programs[1]
    sends = [i for i, a in enumerate(prog) if a.kind == SEND]
    prog[sends[0]], prog[sends[1]] = prog[sends[1]], prog[sends[0]]
    errs = check_fifo(plan)
    assert errs and "FIFO order broken on channel 1->0" in errs[0]


# -- collectives ----------------------------------------------------------------------------------------------

def _allreduce_at(plan):
    return [(d, i) for d, p in sorted(plan.programs.items()) for i, a in enumerate(p) if a.kind == ALLREDUCE]


def test_collective_on_a_device_outside_its_group():
    plan = _transpose("owner")
    d, k = _allreduce_at(plan)[0]
    a = plan.programs[d][k]
    other = tuple(x for x in a.group if x != d)
    plan.programs[d][k] = dataclasses.replace(a, group=other)
    msg = _only(check_collectives(plan), f"device {d} action {k} (")
    assert f"device {d} is not a member of group {other}" in msg


def test_member_that_never_joins_the_group():
    plan = _transpose("owner")
    d, k = _allreduce_at(plan)[-1]
    del plan.programs[d][k]
    errs = check_collectives(plan)
    assert any(e == f"device {d}: never joins the collectives of group [0, 1]" for e in errs), errs
    assert check(plan), "the plan must be refused"


def test_collectives_in_another_order_on_one_member():
    plan = _transpose("owner", P=2, M=4)
    # two collectives of one group on device 1, swapped: device 0 still has the derived order
    plan.programs[1].append(Action(ALLREDUCE, "llm", tensor=WGRAD, group=(0, 1)))
    plan.programs[0].append(Action(ALLREDUCE, "llm", tensor=WGRAD, group=(0, 1)))
    ks = [i for i, a in enumerate(plan.programs[1]) if a.kind == ALLREDUCE]
    p = plan.programs[1]
    p[ks[0]], p[ks[-1]] = p[ks[-1]], p[ks[0]]
    errs = check_collectives(plan)
    assert errs and f"device 1 action {ks[0]}: collective #0 of group [0, 1] differs from device 0's" == errs[0]


# -- deadlock -------------------------------------------------------------------------------------------------

def test_receive_before_send_on_both_sides_deadlocks():
    plan = _1f1b(P=2, M=2)
    # device 0 waits for the first grad before it sends its first activation: locally ordered, FIFO-paired
    p0 = plan.programs[0]
    r = _index(p0, lambda a: a.kind == RECV)
    p0.insert(0, p0.pop(r))
    assert check_fifo(plan) == []
    errs = check_deadlock(plan)
    assert errs and "deadlock" in errs[0] and "device 0 action 0" in errs[0]


def test_check_stops_at_the_first_failing_rule():
    # a plan broken twice reports the more basic finding (structure before dependencies)
    plan = _1f1b()
    plan.programs[0].insert(0, Action("FLY"))
    prog = plan.programs[1]
    prog.append(prog.pop(_index(prog, lambda a: a.kind == RECV)))
    errs = check(plan)
    assert "unknown kind" in errs[0] and not any("neither computed" in e for e in errs)
    assert check_structure(plan, _Structure(plan)) == errs
    assert check_completeness(plan, _Structure(plan)) == []


# -- plans without a chunk table (an exported plan of another tool): structure read from the actions ---------

def _without_chunks(plan):
    return Plan(num_devices=plan.num_devices, num_micro=plan.num_micro, programs=plan.programs,
                trainable=dict(plan.trainable))


@pytest.mark.parametrize("make", [_1f1b, lambda: _transpose("central"), lambda: _transpose("owner", trained=False)])
def test_plan_without_chunk_table_is_checked_from_its_actions(make):
    plan = _without_chunks(make())
    assert check(plan) == []
    st = _Structure(plan)
    assert list(st.regions) == list(make().regions()) and st.holders is None
    assert dict(st.nchunks) == {r: n for r, n in _Structure(make()).nchunks.items()}


def test_plan_without_chunk_table_still_refuses_a_missing_forward():
    plan = _without_chunks(_1f1b())
    prog = plan.programs[1]
    del prog[_index(prog, lambda a: a.kind == F and a.micro == 2)]
    _only(check(plan), "F llm c1 m2 runs 0 times, expected once")


def test_plan_without_chunk_table_infers_trainable_from_weight_grads():
    # no trainable table either: a region with W/BW actions is trained, one without is frozen
    plan = _transpose("owner", trained=False)
    bare = Plan(num_devices=plan.num_devices, num_micro=plan.num_micro, programs=plan.programs)
    st = _Structure(bare)
    assert st.trainable == {"vision": False, "llm": True}
    assert check(bare) == []


# -- the whole check() runs every rule (a rule dropped from the pipeline fails here) ----------------------------

def test_check_runs_the_collective_rule():
    plan = _transpose("owner")
    d, k = _allreduce_at(plan)[-1]
    del plan.programs[d][k]
    errs = check(plan)
    assert errs and "collective" in errs[0], errs


def test_check_runs_the_deadlock_rule():
    plan = _1f1b(P=2, M=2)
    p0 = plan.programs[0]
    p0.insert(0, p0.pop(_index(p0, lambda a: a.kind == RECV)))
    errs = check(plan)
    assert errs and "deadlock" in errs[0]


def test_chunk_holder_equal_to_the_device_count_is_outside():
    plan = _1f1b(P=2)
    plan.chunks[1] = dataclasses.replace(plan.chunks[1], devices=(2,))
    _only(check(plan), "chunk 1 of region 'llm': holders [2] not among devices 0..1")


def test_compute_on_the_chunk_one_past_the_last():
    plan = _1f1b(P=2)
    prog = plan.programs[1]
    k = _index(prog, lambda a: a.kind == F)
    prog[k] = dataclasses.replace(prog[k], chunk=2)
    assert f"device 1 action {k}" in _only(check(plan), "unknown region/chunk")


def test_every_broken_region_is_reported():
    # two regions with bad chunk indices: both named (the table is read to its end)
    plan = _transpose("owner")
    for i, c in enumerate(plan.chunks):
        plan.chunks[i] = dataclasses.replace(c, index=c.index + 5)
    errs = check_chunks(plan)
    assert {e.split(":")[0] for e in errs} == {"chunks of region 'vision'", "chunks of region 'llm'"}


# -- findings a mutation run showed unchecked (docs/mutation.md) ------------------------------------------------

def test_assert_valid_raises_the_first_finding_and_counts_the_rest():
    from hyperparallel.mpipe import assert_valid
    from hyperparallel.errors import PlanError
    good = _1f1b()
    assert assert_valid(good) is good
    plan = _1f1b()
    plan.programs[0].insert(0, Action("FLY"))
    plan.programs[1].insert(0, Action("SWIM"))
    errs = check(plan)
    assert len(errs) == 2
    with pytest.raises(PlanError) as e:
        assert_valid(plan)
    assert str(e.value) == errs[0] + " (+1 more)"


def test_dependency_findings_are_capped_at_21():
    # every receive of device 1 moved to the end: many uses before receipt, reported up to the cap
    plan = _1f1b(P=2, M=30)
    prog = plan.programs[1]
    recvs = [a for a in prog if a.kind == RECV]
    plan.programs[1] = [a for a in prog if a.kind != RECV] + recvs
    errs = check_dependencies(plan, _Structure(plan))
    assert len(errs) == 21


def test_receive_on_a_channel_its_peer_never_sends_on():
    # P = 3: device 0 sends nothing to device 2 in 1F1B; a receive from it is on a channel with no sends
    plan = _1f1b(P=3, M=3, layers=3)
    plan.programs[2].insert(0, Action(RECV, "llm", 0, 0, peer=0, tensor="act"))
    errs = check_fifo(plan)
    assert errs == ["device 2 action 0 (RECV act llm c0 m0 <-0): awaits ('act', 'llm', 0, 0) from device 0, which "
                    "never sends it"]


def test_send_on_a_channel_its_peer_never_receives_on():
    plan = _1f1b(P=3, M=3, layers=3)
    k = len(plan.programs[0])
    plan.programs[0].append(Action(SEND, "llm", 0, 0, peer=2, tensor="act"))
    errs = check_fifo(plan)
    assert errs == [f"device 0 action {k} (SEND act llm c0 m0 ->2): sends ('act', 'llm', 0, 0) to device 2, which "
                    "never receives it"]


def test_fifo_break_names_both_messages():
    plan = _1f1b()
    prog = plan.programs[0]
    sends = [i for i, a in enumerate(prog) if a.kind == SEND]
    first = prog.pop(sends[0])
    prog.insert(sends[1], first)
    errs = check_fifo(plan)
    k = next(i for i, a in enumerate(plan.programs[1]) if a.kind == RECV)
    s = sends[1] - 1   # device 0's action now first on the channel: the old second send
    assert errs == [f"device 1 action {k} (RECV act llm c0 m0 <-0): FIFO order broken on channel 0->1: awaits "
                    f"('act', 'llm', 0, 0) as message #0, but device 0 action {s} ({plan.programs[0][s].label()}) "
                    f"sends ('act', 'llm', 0, 1) in that place"]


def test_collectives_after_a_data_parallel_allreduce_are_still_checked():
    # a hand-made plan whose data-parallel all-reduce comes before a broken plan collective: still refused
    plan = derive(mllm(True), "transpose", 2, 4, 1, 2)
    assert check(plan) == []
    dp = Action(ALLREDUCE, "llm", tensor=WGRAD, group="dp")
    for d in (0, 1):
        plan.programs[d].insert(0, dp)
    d, k = _allreduce_at(plan)[-1]
    a = plan.programs[d][k]
    if a.group == "dp":
        d, k = [(d2, k2) for d2, k2 in _allreduce_at(plan) if plan.programs[d2][k2].group != "dp"][-1]
        a = plan.programs[d][k]
    plan.programs[d][k] = dataclasses.replace(a, group=tuple(x for x in a.group if x != d))
    errs = check_collectives(plan)
    assert errs and f"device {d} is not a member of group" in errs[0]


def test_assert_valid_of_a_single_finding_adds_no_count():
    from hyperparallel.mpipe import assert_valid
    from hyperparallel.errors import PlanError
    plan = _1f1b()
    plan.programs[0].insert(0, Action("FLY"))
    errs = check(plan)
    assert errs == ["device 0 action 0 (FLY): unknown kind"]
    with pytest.raises(PlanError) as e:
        assert_valid(plan)
    assert str(e.value) == errs[0]


def _wgrad_allreduce():
    return Action(ALLREDUCE, "llm", tensor=WGRAD, group=(0, 1))


def test_fifo_orders_collectives_among_the_messages_of_a_channel():
    # a collective of both devices appended to each program is valid; device 1 joining it before its first
    # receive while device 0 sends first breaks the order of channel 0->1 (the collective is a marker there)
    plan = _1f1b(P=2, M=2)
    for d in (0, 1):
        plan.programs[d].append(_wgrad_allreduce())
    assert check(plan) == []
    p1 = plan.programs[1]
    p1.insert(0, p1.pop())
    s = _index(plan.programs[0], lambda a: a.kind == SEND)
    errs = check_fifo(plan)
    assert errs[0] == ("device 1 action 0 (ALLREDUCE llm group=[0, 1]): FIFO order broken on channel 0->1: awaits "
                       "('collective', 'ALLREDUCE', 'wgrad', 'llm', (0, 1), None, 0) as message #0, but device 0 "
                       f"action {s} (SEND act llm c0 m0 ->1) sends ('act', 'llm', 0, 0) in that place")


def test_fifo_counts_the_collectives_of_a_group_per_device():
    # device 0 joins three collectives of one group, device 1 two: the third (#2) has no partner
    plan = _1f1b(P=2, M=2)
    for d, n in ((0, 3), (1, 2)):
        plan.programs[d] += [_wgrad_allreduce() for _ in range(n)]
    k0, k1 = len(plan.programs[0]) - 1, len(plan.programs[1])
    key = "('collective', 'ALLREDUCE', 'wgrad', 'llm', (0, 1), None, 2)"
    assert check_fifo(plan) == [
        f"device 0 action {k0} (ALLREDUCE llm group=[0, 1]): sends {key} to device 1, which never receives it",
        f"device 0 action {k0} (ALLREDUCE llm group=[0, 1]): awaits {key} from device 1, which never sends it"]
    assert k1 > 0


@pytest.mark.parametrize("extra_on", [0, 1])
def test_a_member_with_one_collective_more_or_less(extra_on):
    # device 0 is the reference: device 1 running out early ends its program; one more on device 1 is named
    plan = _1f1b(P=2, M=2)
    for d in (0, 1):
        plan.programs[d] += [_wgrad_allreduce()] * (2 if d == extra_on else 1)
    errs = check_collectives(plan)
    if extra_on == 0:
        assert errs == ["device 1 (end of program): collective #1 of group [0, 1] differs from device 0's"]
    else:
        k = len(plan.programs[1]) - 1
        assert errs == [f"device 1 action {k}: collective #1 of group [0, 1] differs from device 0's"]


def test_every_collective_outside_its_group_is_reported():
    plan = _1f1b(P=2, M=2)
    n = len(plan.programs[1])
    plan.programs[1] += [Action(ALLREDUCE, "llm", tensor=WGRAD, group=(0,))] * 2
    assert check_collectives(plan) == [
        f"device 1 action {n + i} (ALLREDUCE llm group=[0]): device 1 is not a member of group (0,)" for i in (0, 1)]


def _frozen_llm_behind_trained_encoder():
    plan = derive(profile(("vision", 2, True), ("llm", 4, False)), "1f1b", 2, 2)
    assert check(plan) == []
    d, k = next((d, i) for d, p in plan.programs.items() for i, a in enumerate(p)
                if a.region == "llm" and a.kind == B and a.micro == 0)
    return plan, d, k


@pytest.mark.parametrize("edit, counts", [("add W", "0 BW, 1 B, 1 W"), ("add BW", "1 BW, 1 B, 0 W"),
                                          ("drop B", "0 BW, 0 B, 0 W")])
def test_frozen_region_needing_its_input_grad_gets_exactly_one_b(edit, counts):
    plan, d, k = _frozen_llm_behind_trained_encoder()
    prog = plan.programs[d]
    a = prog[k]
    if edit == "drop B":
        del prog[k]
    else:
        prog.insert(k + 1, dataclasses.replace(a, kind=edit.split()[1]))
    errs = check_completeness(plan, _Structure(plan))
    assert errs == [f"backward of llm c{a.chunk} m0: {counts}; expected one B (frozen, input grad only)"]


@pytest.mark.parametrize("kind", [B, W, R])
def test_any_backward_task_for_a_frozen_prefix_is_refused(kind):
    plan = _transpose("owner", trained=False)
    d, a = next((d, a) for d, p in plan.programs.items() for a in p if a.region == "vision" and a.kind == F)
    plan.programs[d].append(dataclasses.replace(a, kind=kind))
    assert check_completeness(plan, _Structure(plan)) == [
        f"backward of vision c0 m{a.micro} scheduled, but vision and everything before it is frozen"]


def test_check_refuses_a_collective_over_a_named_group_other_than_data_parallel():
    # only "dp" names a group; any other name is no member list (the FIFO rule has no channel for it, the
    # collective rule refuses it before the deadlock run would try to gather its members)
    plan = _1f1b(P=2, M=2)
    k = len(plan.programs[0])
    plan.programs[0].append(Action(ALLREDUCE, "llm", tensor=WGRAD, group="tp"))
    assert check(plan) == [f"device 0 action {k} (ALLREDUCE llm group=tp): device 0 is not a member of group tp"]
    # the executor (cost model, timing estimate) run on such a plan unchecked: a clear refusal, not a KeyError
    with pytest.raises(PlanError, match=rf"^device 0 action {k} \(ALLREDUCE llm group=tp\): group 'tp' is not a "
                                        r"group: give 'dp' or a tuple of devices$"):
        execute(plan, lambda a: 1.0, lambda a: 1.0)


def _central_three_regions():
    # central backward of a trained two-region encoder: device 0 recomputes vision and proj of every micro-batch
    plan = derive(profile(("vision", 2, True), ("proj", 1, True), ("llm", 4, True)), "transpose(backward=central)",
                  2, 2)
    assert check(plan) == []
    return plan


def test_a_recompute_reads_the_recompute_of_the_chunk_before_it():
    # device 0 recomputes vision m1 before proj m1 and no longer receives vision's m1 output: proj's recompute
    # reads vision's recompute, so the plan stays valid
    plan = _central_three_regions()
    p0, p1 = plan.programs[0], plan.programs[1]
    p0.remove(next(a for a in p0 if a.kind == RECV and a.region == "vision" and a.micro == 1))
    p1.remove(next(a for a in p1 if a.kind == SEND and a.region == "vision" and a.micro == 1))
    rv = p0.pop(_index(p0, lambda a: a.kind == R and a.region == "vision" and a.micro == 1))
    p0.insert(_index(p0, lambda a: a.kind == R and a.region == "proj" and a.micro == 1), rv)
    assert check(plan) == []
    # without vision's recompute first, proj's recompute has no input on device 0
    p0.remove(rv)
    p0.append(rv)
    k = _index(p0, lambda a: a.kind == R and a.region == "proj" and a.micro == 1)
    assert check_dependencies(plan, _Structure(plan))[0] == (
        f"device 0 action {k} (R proj c0 m1): needs act of vision c0 m1, which is neither computed nor received "
        "earlier on device 0")


def test_a_compute_action_without_a_chunk_is_refused():
    plan = _1f1b()
    prog = plan.programs[0]
    k = _index(prog, lambda a: a.kind == F)
    prog[k] = dataclasses.replace(prog[k], chunk=None)
    assert check_structure(plan, _Structure(plan)) == [f"device 0 action {k} (F llm m0): unknown region/chunk"]


def test_a_plan_without_compute_has_no_dependencies_to_check():
    from hyperparallel.mpipe import Plan
    plan = Plan(num_devices=2, num_micro=1, programs={0: [], 1: []})
    assert check_dependencies(plan, _Structure(plan)) == []


# -- tied weights (check_tied) ------------------------------------------------------------------------------------

def _tied_1f1b():
    # 1F1B, P = 2, LLM of 4 layers: the embedding tied between layer 0 (chunk 0, device 0) and 3 (chunk 1, device 1)
    from hyperparallel.mpipe.profile import TiedWeight
    prof = profile(("llm", 4, True))
    prof = dataclasses.replace(prof, tied=(TiedWeight("embed", "llm", (0, 3), 1.0),))
    plan = derive(prof, "1f1b", 2, 2)
    assert check(plan) == [] and [(t.chunks, t.devices) for t in plan.tied] == [((0, 1), (0, 1))]
    return plan


def _tied_reduces(plan):
    return [(d, i) for d, p in sorted(plan.programs.items()) for i, a in enumerate(p)
            if a.kind == ALLREDUCE and a.tensor == "tied"]


def test_tied_entry_naming_a_chunk_that_does_not_exist():
    plan = _tied_1f1b()
    plan.tied[0] = dataclasses.replace(plan.tied[0], chunks=(5, 0, 1))
    assert check_tied(plan, _Structure(plan)) == ["tied[0] (embed): chunk 5 of region 'llm' does not exist"]


def test_tied_entry_whose_devices_are_not_its_chunks_holders():
    # devices (0,) for chunks held by 0 and 1; with one device listed nothing is to be summed, so both
    # derived ALLREDUCE tied are refused as well
    plan = _tied_1f1b()
    plan.tied[0] = dataclasses.replace(plan.tied[0], devices=(0,))
    assert check_tied(plan, _Structure(plan)) == (
        ["tied[0] (embed): devices [0] but its chunks are held by [0, 1]"]
        + [f"device {d} action {i} (ALLREDUCE tied llm group=[0, 1]): no tied weight of the plan has copies on "
           "exactly these devices" for d, i in _tied_reduces(plan)])
    assert len(_tied_reduces(plan)) == 2


def test_tied_weight_within_one_replicated_chunk_needs_no_allreduce():
    # transpose: the encoder's one chunk is held by both devices; a weight tied within that chunk is one
    # parameter per device (the replicas' own all-reduce sums it), so no ALLREDUCE tied is expected
    from hyperparallel.mpipe.ir import Tied
    plan = _transpose("owner")
    (c,) = [c for c in plan.chunks if c.region == "vision"]
    assert len(c.devices) == 2
    plan.tied.append(Tied("patch", "vision", (0, 0), tuple(c.devices)))
    assert check_tied(plan, _Structure(plan)) == []


def test_tied_plan_without_a_chunk_table_is_checked_from_its_actions():
    plan = _tied_1f1b()
    plan.chunks = []
    assert check(plan) == []


def test_tied_allreduce_before_the_weight_grad_right_after_it_names_that_one():
    # device 1's ALLREDUCE tied moved to just before its last BW: the only weight grad it misses is the next
    # action
    plan = _tied_1f1b()
    p1 = plan.programs[1]
    ar = p1.pop(_index(p1, lambda a: a.kind == ALLREDUCE and a.tensor == "tied"))
    b = max(i for i, a in enumerate(p1) if a.kind == BW)
    p1.insert(b, ar)
    assert check_tied(plan, _Structure(plan)) == [
        f"device 1 action {b} (ALLREDUCE tied llm group=[0, 1]): before {p1[b + 1].label()} (action {b + 1}), whose "
        "weight grads of embed it must sum"]
    assert p1[b + 1].kind == BW   # the last one: late is [b + 1] alone


def test_tied_allreduce_early_names_the_first_weight_grad_after_it():
    plan = _tied_1f1b()
    p0 = plan.programs[0]
    ar = p0.pop(_index(p0, lambda a: a.kind == ALLREDUCE and a.tensor == "tied"))
    p0.insert(0, ar)
    w = _index(p0, lambda a: a.kind == BW)
    assert check_tied(plan, _Structure(plan)) == [
        f"device 0 action 0 (ALLREDUCE tied llm group=[0, 1]): before {p0[w].label()} (action {w}), whose "
        "weight grads of embed it must sum"]


def test_tied_allreduce_twice_on_a_device_and_every_unmatched_one_are_reported():
    plan = _tied_1f1b()
    p0 = plan.programs[0]
    p0.append(p0[_index(p0, lambda a: a.kind == ALLREDUCE and a.tensor == "tied")])
    assert check_tied(plan, _Structure(plan)) == [
        "device 0: 2 ALLREDUCE tied of tied[0] (embed) over devices [0, 1], expected exactly one"]
    n = len(p0)
    p0 += [Action(ALLREDUCE, "llm", tensor="tied", group=(0,))] * 2
    errs = check_tied(plan, _Structure(plan))
    assert errs[:2] == [f"device 0 action {n + i} (ALLREDUCE tied llm group=[0]): no tied weight of the plan has "
                        "copies on exactly these devices" for i in (0, 1)]
