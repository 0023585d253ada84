"""Cost-model branches users reach, each figure derived by hand here (not read back from the model):
several steps, per-step and per-action overheads, bubbles, and the data-parallel all-reduce of frozen and
trained regions (D > 1)."""
import pytest

from hyperparallel.mpipe import check, derive, parse_profile
from hyperparallel.mpipe.cost import simulate
from hyperparallel.mpipe.ir import ALLREDUCE, DP_GROUP

# 1F1B, P = 2, M = 3, one layer per chunk: f = 1, b = 2, w = 0.5 ms (fused into one BW of 2.5 ms)
P, M = 2, 3
F_MS, B_MS, W_MS = 1.0, 2.0, 0.5
SLOT = F_MS + B_MS + W_MS
ONE_STEP = (M + P - 1) * SLOT        # 14.0: the 1F1B closed form


def _llm(**top):
    regions = [{"name": "llm", "layers": P, "trainable": True, "forward_ms": F_MS, "backward_ms": B_MS,
                "weight_ms": W_MS, "activation_mb": 1.0, "param_mb": 1.0}]
    return parse_profile(dict({"regions": regions}, **top))


def _run(prof, schedule="1f1b", D=1, steps=1):
    plan = derive(prof, schedule, P, M, 1, D)
    assert check(plan) == []
    return simulate(plan, prof, steps=steps)


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_several_steps_report_one_steady_step_not_their_sum(steps):
    rep = _run(_llm(), steps=steps)
    assert rep.step_ms == pytest.approx(ONE_STEP)
    assert rep.execution.step_ends == pytest.approx([ONE_STEP * (s + 1) for s in range(steps)])
    # busy time of the last step only: M slots per device
    assert [d.busy_ms for d in rep.devices] == pytest.approx([M * SLOT] * P)


@pytest.mark.parametrize("steps", [1, 2])
def test_step_overhead_is_added_once_per_step(steps):
    rep = _run(_llm(step_overhead_ms=0.7), steps=steps)
    assert rep.step_ms == pytest.approx(ONE_STEP + 0.7)
    # the bubble counts the overhead as idle time on every device
    assert rep.bubble_ratio == pytest.approx(1 - (P * M * SLOT) / (P * (ONE_STEP + 0.7)))


def test_action_overhead_is_added_to_every_compute_action():
    # every F and every BW pays 0.1 ms: a 1F1B slot becomes f + bw + 2 x 0.1
    rep = _run(_llm(action_overhead_ms=0.1))
    assert rep.step_ms == pytest.approx((M + P - 1) * (SLOT + 0.2))
    assert rep.bubble_ratio == pytest.approx(1 - M / (M + P - 1))


def test_bubble_of_1f1b_is_p_minus_1_over_m_plus_p_minus_1():
    rep = _run(_llm())
    assert rep.bubble_ratio == pytest.approx((P - 1) / (M + P - 1))


# -- data parallel (D = 2): each device all-reduces the gradients of the trained parameters it holds ---------

LINK = {"latency_ms": 0.0, "bandwidth_gb_s": 1.0}


def _mb_ms(mb):
    """A ring all-reduce over 2 members moves 2 (g - 1) / g = 1 x the bytes: mb MB at 1 GB/s."""
    return mb / 1024.0 * 1000.0


def _mllm(vision_trainable: bool):
    regions = [{"name": "vision", "layers": 1, "trainable": vision_trainable, "forward_ms": 1.0, "backward_ms": 1.0,
                "param_mb": 100.0},
               {"name": "llm", "layers": 4, "trainable": True, "forward_ms": 1.0, "backward_ms": 1.0,
                "param_mb": 10.0}]
    return parse_profile({"regions": regions, "link": LINK})


def _dp_allreduce_ms(rep, d):
    return [t.end - t.start for t in rep.execution.timeline[d] if t.action.kind == ALLREDUCE
            and t.action.group == DP_GROUP]


def test_frozen_encoder_parameters_stay_out_of_the_data_parallel_allreduce():
    # encoder placed on device 0, frozen: device 0 all-reduces its two LLM layers (20 MB), not the 100 MB encoder
    prof = _mllm(False)
    plan = derive(prof, "1f1b", P, M, 1, 2)
    assert check(plan) == []
    rep = simulate(plan, prof)
    assert _dp_allreduce_ms(rep, 0) == [pytest.approx(_mb_ms(20.0))]
    assert _dp_allreduce_ms(rep, 1) == [pytest.approx(_mb_ms(20.0))]


def test_trained_encoder_replicas_join_the_data_parallel_allreduce():
    # transpose, trained encoder: each device holds a trained 100 MB replica plus its two LLM layers
    prof = _mllm(True)
    plan = derive(prof, "transpose", P, M, 1, 2)
    assert check(plan) == []
    rep = simulate(plan, prof)
    assert _dp_allreduce_ms(rep, 0) == [pytest.approx(_mb_ms(120.0))]
    assert _dp_allreduce_ms(rep, 1) == [pytest.approx(_mb_ms(120.0))]
    # and the replicas' own all-reduce over the pipeline devices moves the encoder's 100 MB
    plan_ar = [t.end - t.start for t in rep.execution.timeline[0]
               if t.action.kind == ALLREDUCE and t.action.group != DP_GROUP]
    assert plan_ar == [pytest.approx(_mb_ms(100.0))]


def test_data_parallel_allreduce_lengthens_the_step_by_the_last_devices_allreduce():
    # the LLM alone, D = 2: every device ends its step with its gradient all-reduce; device 0 ends last in
    # 1F1B (its last backward is the step's last compute), so the step grows by device 0's all-reduce
    regions = [{"name": "llm", "layers": P, "trainable": True, "forward_ms": F_MS, "backward_ms": B_MS,
                "weight_ms": W_MS, "param_mb": 50.0}]
    prof = parse_profile({"regions": regions, "link": LINK})
    one = simulate(derive(prof, "1f1b", P, M, 1, 1), prof)
    two = simulate(derive(prof, "1f1b", P, M, 1, 2), prof)
    assert one.step_ms == pytest.approx(ONE_STEP)
    assert two.step_ms == pytest.approx(ONE_STEP + _mb_ms(50.0))
