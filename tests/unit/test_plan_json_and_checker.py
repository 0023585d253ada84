"""Plan JSON round trip and the checker's findings on broken plans."""
import json

import pytest

from hyperparallel.mpipe import Action, Plan, check, derive
from hyperparallel.mpipe.ir import BW, RECV, SEND

from helpers import mllm, profile


def test_plan_json_round_trip_keeps_every_action():
    plan = derive(mllm(True), "transpose(backward=central)", 3, 6)
    text = plan.dumps()
    obj = json.loads(text)
    assert set(obj["programs"]) == {"0", "1", "2"}
    first = obj["programs"]["0"][0]
    assert first["kind"] == "BROADCAST" and first["region"] == "vision"
    sends = [a for a in obj["programs"]["1"] if a["kind"] == "SEND"]
    assert sends and all({"kind", "region", "chunk", "micro", "peer"} <= set(a) for a in sends)
    back = Plan.loads(text)
    assert back.programs == plan.programs
    assert back.chunks == plan.chunks and back.trainable == plan.trainable
    assert check(back) == []


def _two_stage():
    return derive(profile(("llm", 4, True)), "1f1b", 2, 3)


def test_checker_accepts_derived_plan():
    assert check(_two_stage()) == []


def test_checker_reports_fifo_break_with_device_and_index():
    plan = _two_stage()
    prog = plan.programs[0]
    sends = [i for i, a in enumerate(prog) if a.kind == SEND]
    first = prog.pop(sends[0])
    prog.insert(sends[1], first)  # device 0 now sends m1 before m0; device 1 still expects m0 first
    errs = check(plan)
    assert errs, "reordered sends must be refused"
    k = next(i for i, a in enumerate(plan.programs[1]) if a.kind == RECV)
    assert errs[0].startswith(f"device 1 action {k} ") and "FIFO order broken on channel 0->1" in errs[0]


def test_checker_reports_missing_send():
    plan = _two_stage()
    prog = plan.programs[0]
    k = next(i for i, a in enumerate(prog) if a.kind == SEND)
    del prog[k]
    errs = check(plan)
    assert errs and "device 1 action" in errs[0] and "never sends" in errs[0]


def test_checker_reports_missing_backward():
    plan = _two_stage()
    prog = plan.programs[0]
    k = next(i for i, a in enumerate(prog) if a.kind == BW)
    del prog[k]
    errs = check(plan)
    assert errs and "backward of llm c0 m0" in errs[0]


def test_checker_reports_use_before_receive():
    plan = _two_stage()
    prog = plan.programs[1]
    k = next(i for i, a in enumerate(prog) if a.kind == RECV)
    prog.insert(len(prog), prog.pop(k))  # receive moved to the very end
    errs = check(plan)
    assert errs and f"device 1 action {k}" in errs[0] and "neither computed nor received" in errs[0]


def test_checker_reports_deadlock_naming_what_is_awaited():
    # both devices receive before they send: every program is locally fine and FIFO-paired
    plan = Plan(num_devices=2, num_micro=1, programs={
        0: [Action(RECV, "llm", 9, 0, peer=1, tensor="act"), Action(SEND, "llm", 8, 0, peer=1, tensor="act")],
        1: [Action(RECV, "llm", 8, 0, peer=0, tensor="act"), Action(SEND, "llm", 9, 0, peer=0, tensor="act")]})
    from hyperparallel.mpipe.check import check_deadlock, check_fifo
    assert check_fifo(plan) == []
    errs = check_deadlock(plan)
    assert errs and "deadlock" in errs[0]
    assert "device 0 action 0" in errs[0] and "waits for a message from device 1" in errs[0]


def test_loading_garbage_plan_is_refused():
    with pytest.raises(ValueError, match="programs"):
        Plan.from_json({"nope": 1})
    with pytest.raises(ValueError, match="kind"):
        Plan.from_json({"programs": {"0": [{"kind": "FLY"}]}})
