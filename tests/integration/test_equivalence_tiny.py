"""Pipelined runs on 2 and 4 msrun ranks train exactly like the single-process reference.

One msrun launch per rank count: the workers loop over many (schedule, frozen)
cases and dump per-case losses and step-0 gradients; pytest compares them with
an in-process reference (``mindspore.value_and_grad`` over the whole model).
Checkpoint/resume rides along in the 2-rank launch (save after 2 steps, rebuild
the model, resume, compare step 3 with the uninterrupted run).
"""
import json
import os

import numpy as np
import pytest

pytest.importorskip("mindspore", reason="mindspore is not installed")

from helpers import (assert_equivalent, assert_memory_predicted, case_name, dumped, job_case,  # noqa: E402
                     launch_cases, reference_run)
from hyperparallel.recipe import load_recipe  # noqa: E402

RECIPE = os.path.join(os.path.dirname(__file__), "..", "..", "recipes", "tiny_mllm.yaml")
STEPS = 3
SCHEDULES_2 = ["gpipe", "1f1b", "interleaved", "zb_h1", "transpose", "transpose(backward=central)",
               "transpose(order=zbv)"]
TRAINED_ONLY_2 = ["interleaved_zb", "zbv", "dualpipev", "interleaved_zb_fast", "zbv_fast"]  # encoder placed on rank 0: frozen adds little here
CASES_2 = [(s, fz) for s in SCHEDULES_2 for fz in (False, True)] + [(s, False) for s in TRAINED_ONLY_2]
V2_ORDERS = ("interleaved", "zbv", "dualpipev")  # run with pp_interleave_num=2 (interleaved_zb included)
SHARDED = "transpose(optimizer=sharded)"   # trained encoders only (a frozen one has no optimizer state)
SPILL = "transpose(spill=next_step)"
SPILL_BALANCED = "transpose(owners=balanced, spill=next_step)"
UNEVEN = "[{region: vision, skeleton: place}, {region: llm, skeleton: pipe, order: 1f1b, layers: [3, 1]}]"
EAGER = ("mpipe.compile=eager",)
# activation recompute (issue 37.2): the LLM's forwards run again before their backward (trained encoder)
RECOMPUTE_2 = ["1f1b(recompute=full)", "1f1b(recompute=layers=1)", "interleaved(recompute=layers=1)",
               "transpose(recompute=full)", "transpose(recompute=layers=1)", "zb_h1(recompute=full)"]
# the list form: the transposed encoder recomputed on its owners too, the LLM's first layer of each chunk
RECOMPUTE_BOTH = ("[{region: vision, skeleton: transpose, recompute: full}, "
                  "{region: llm, skeleton: pipe, order: 1f1b, recompute: layers=1}]")


def _overrides(schedule: str, frozen: bool, extra=()):
    ov = [f"mpipe.profile.regions.0.trainable={'false' if frozen else 'true'}", f"train.steps={STEPS}"]
    if any(o in schedule for o in V2_ORDERS) and not any("pp_interleave_num" in e for e in extra):
        ov.append("parallel_config.pp_interleave_num=2")
    return ov + list(extra)


def _case(tmp, schedule, frozen, extra=(), **kw):
    name = case_name(f"{schedule}_{'frozen' if frozen else 'trained'}_{'_'.join(extra)}")
    return job_case(tmp, RECIPE, schedule, name, _overrides(schedule, frozen, extra), **dict(dict(steps=STEPS), **kw), chunks="jit")


def _dumped(case):
    got, grads = dumped(case["dump_dir"])
    return got["losses"], grads


_REF_CACHE = {}


def reference(frozen: bool, extra=()):
    """Per-step losses and step-0 grads of the single-process reference."""
    key = (frozen, tuple(extra))
    if key not in _REF_CACHE:
        _REF_CACHE[key] = reference_run(load_recipe(RECIPE, overrides=_overrides("1f1b", frozen, extra)), STEPS)
    return _REF_CACHE[key]


def assert_matches_reference(case, frozen, extra=()):
    grads = assert_equivalent(case, *reference(frozen, extra))
    if frozen:
        assert not any(k.startswith("vision.") for k in grads)
    else:
        assert any(k.startswith("vision.") for k in grads)


@pytest.fixture(scope="module")
def two_rank(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("rt2"))
    cases = [_case(tmp, s, fz) for s, fz in CASES_2]
    cases.append(_case(tmp, SPILL, True))  # next-step spill: frozen encoders only
    cases.append(_case(tmp, UNEVEN, False))  # explicit uneven cut of the LLM (3 + 1 layers)
    cases.append(_case(tmp, "zb_h1", False, EAGER))  # the eager path stays tested (every other case compiles)
    cases += [_case(tmp, s, False) for s in RECOMPUTE_2 + [RECOMPUTE_BOTH]]
    ckpt = os.path.join(tmp, "ckpt")
    cases.append(_case(tmp, "transpose", False, steps=2, save_dir=ckpt, save_every=1,
                       dump_dir=os.path.join(tmp, "dump", "ckpt_first")))
    cases.append(_case(tmp, "transpose", False, steps=STEPS, save_dir=ckpt, resume=True,
                       dump_dir=os.path.join(tmp, "dump", "ckpt_resumed")))
    # the sharded encoder optimizer: trains like the reference; its checkpoints keep the global names, so a
    # run saved unsharded resumes sharded and the reverse
    cases.append(_case(tmp, SHARDED, False))
    step2 = os.path.join(ckpt, "step_2")   # named before it exists: ckpt_resumed adds step_3 to ckpt
    cases.append(_case(tmp, SHARDED, False, steps=STEPS, dump_dir=os.path.join(tmp, "dump", "ckpt_resumed_sharded"),
                       resume_from={"path": step2, "step": 2, "meta": {"step": 2},
                                    "files": [os.path.join(step2, f"rank_{r}.safetensors") for r in (0, 1)]}))
    ckpt_s = os.path.join(tmp, "ckpt_sharded")
    cases.append(_case(tmp, SHARDED, False, steps=2, save_dir=ckpt_s, save_every=1,
                       dump_dir=os.path.join(tmp, "dump", "ckpt_first_sharded")))
    cases.append(_case(tmp, "transpose", False, steps=STEPS, save_dir=ckpt_s, resume=True,
                       dump_dir=os.path.join(tmp, "dump", "ckpt_resumed_unsharded")))
    launch_cases(tmp, cases, 2, timeout=1500)   # compiled chunks: ~10-20 s of compiles per case on 2 loaded cores
    return {c["name"] if "ckpt" not in c["dump_dir"] else os.path.basename(c["dump_dir"]): c for c in cases}


@pytest.mark.msrun
@pytest.mark.parametrize("schedule,frozen", CASES_2, ids=[f"{s}-{'frozen' if fz else 'trained'}" for s, fz in CASES_2])
def test_two_ranks_match_reference(two_rank, schedule, frozen):
    name = case_name(f"{schedule}_{'frozen' if frozen else 'trained'}_")
    case = two_rank[name]
    if "zbv" in schedule or "dualpipev" in schedule:  # V-shape: llm chunks 0 and 3 on rank 0, 1 and 2 on rank 1
        assert [c["devices"] for c in case["plan"]["chunks"] if c["region"] == "llm"] == [[0], [1], [1], [0]]
    if schedule == "dualpipev":
        assert any(a.get("pair") for p in case["plan"]["programs"].values() for a in p)
    assert_matches_reference(case, frozen)


@pytest.mark.msrun
def test_two_ranks_next_step_spill_matches_reference(two_rank):
    case = two_rank[case_name(f"{SPILL}_frozen_")]
    assert any(a.get("step") for p in case["plan"]["programs"].values() for a in p), "plan must spill"
    assert_matches_reference(case, True)


@pytest.mark.msrun
def test_two_ranks_uneven_cut_matches_reference(two_rank):
    case = two_rank[case_name(f"{UNEVEN}_trained_")]
    assert [c["stop"] - c["start"] for c in case["plan"]["chunks"] if c["region"] == "llm"] == [3, 1]
    assert_matches_reference(case, False)


@pytest.mark.msrun
@pytest.mark.parametrize("schedule", RECOMPUTE_2)
def test_two_ranks_recompute_matches_reference_and_the_memory_prediction(two_rank, schedule):
    """Recomputed chunks train like the reference; every rank's held forwards and held bytes (kept inputs
    included) equal the cost model's. Full recompute holds one LLM forward at a time on rank 0 (1F1B's warmup
    held two); layers=K holds as many (its kept parts) but adds a boundary (more boundary bytes, less inside)."""
    from helpers import measured_memory
    case = two_rank[case_name(f"{schedule}_trained_")]
    assert any(c.get("recompute") for c in case["plan"]["chunks"])
    assert_matches_reference(case, False)
    assert_memory_predicted(case, load_recipe(RECIPE, overrides=_overrides(schedule, False)))
    plain = two_rank[case_name(f"{schedule.split('(')[0]}_trained_")]
    got, base = measured_memory(case["dump_dir"])[0][0], measured_memory(plain["dump_dir"])[0][0]
    if "full" in schedule:
        assert got["peak_held"]["llm"] == 1 < base["peak_held"]["llm"]


@pytest.mark.msrun
def test_two_ranks_encoder_and_llm_recompute_match_reference_and_the_memory_prediction(two_rank):
    case = two_rank[case_name(f"{RECOMPUTE_BOTH}_trained_")]
    assert [(c["region"], c.get("recompute", False)) for c in case["plan"]["chunks"]] == [
        ("vision", True)] + [("llm", True), ("llm", False)] * 2
    assert_matches_reference(case, False)
    assert_memory_predicted(case, load_recipe(RECIPE, overrides=_overrides(RECOMPUTE_BOTH, False)))


@pytest.mark.msrun
def test_two_ranks_eager_chunks_match_reference(two_rank):
    case = two_rank[case_name(f"zb_h1_trained_{EAGER[0]}")]
    assert_matches_reference(case, False, EAGER)
    assert_compiled(case, "eager")


def assert_compiled(case, mode):
    """Every chunk of every rank ran ``mode``; compiled, an LLM chunk after the first compiled once (its
    input shape is fixed), the others once per distinct input shape."""
    seen = []
    for rank in (0, 1):
        with open(os.path.join(case["dump_dir"], f"compile_rank{rank}.json")) as f:
            seen += json.load(f)
    assert seen and all(s["mode"] == mode for s in seen), seen
    for s in seen:
        graphs = s["compiles"] + s["reused"]   # compiled in this case, or by an earlier case of the launch
        if mode == "eager":
            assert graphs == 0
        elif s["chunk"].startswith("llm/") and s["chunk"] != "llm/0":
            assert graphs == 1, s
        else:   # the input shape varies with the images: one static graph per distinct shape and grad mode (a
            # chunk run both on the tape and off it, as central backward's device 0, compiles a shape twice)
            assert 1 <= s["shapes"] <= graphs <= 2 * s["shapes"], s


@pytest.mark.msrun
@pytest.mark.parametrize("schedule,frozen", CASES_2[:4], ids=[f"{s}-{'frozen' if fz else 'trained'}"
                                                              for s, fz in CASES_2[:4]])
def test_two_ranks_ran_compiled_by_default(two_rank, schedule, frozen):
    assert_compiled(two_rank[case_name(f"{schedule}_{'frozen' if frozen else 'trained'}_")], "jit")


@pytest.mark.msrun
def test_resume_continues_like_uninterrupted_run(two_rank):
    first, _ = _dumped(two_rank["ckpt_first"])
    with open(os.path.join(two_rank["ckpt_resumed"]["dump_dir"], "losses.json")) as f:
        resumed = json.load(f)
    full, _ = _dumped(two_rank[case_name("transpose_trained_")])
    assert resumed["start"] == 2 and len(resumed["losses"]) == STEPS - 2
    np.testing.assert_allclose(first + resumed["losses"], full, rtol=1e-6)


@pytest.mark.msrun
def test_two_ranks_sharded_encoder_optimizer_matches_reference(two_rank):
    case = two_rank[case_name(f"{SHARDED}_trained_")]
    assert any(a["kind"] == "ALLGATHER" for a in case["plan"]["programs"]["0"])
    assert_matches_reference(case, False)
    # the same losses as the unsharded run
    np.testing.assert_allclose(_dumped(case)[0], _dumped(two_rank[case_name("transpose_trained_")])[0], rtol=1e-5)


@pytest.mark.msrun
@pytest.mark.parametrize("saved,resumed", [("ckpt_first", "ckpt_resumed_sharded"),
                                           ("ckpt_first_sharded", "ckpt_resumed_unsharded")])
def test_sharded_and_unsharded_checkpoints_resume_each_other(two_rank, saved, resumed):
    first, _ = _dumped(two_rank[saved])
    with open(os.path.join(two_rank[resumed]["dump_dir"], "losses.json")) as f:
        rest = json.load(f)
    full, _ = _dumped(two_rank[case_name("transpose_trained_")])
    assert rest["start"] == 2 and len(rest["losses"]) == STEPS - 2
    np.testing.assert_allclose(first + rest["losses"], full, rtol=1e-5)
    # the files carry the global names: per-parameter Adam state of the encoder, no shard names
    import safetensors.numpy as stn
    step = os.path.join(two_rank[saved]["save_dir"], "step_2")
    names = set()
    for fn in os.listdir(step):
        if fn.endswith(".safetensors"):
            names |= set(stn.load_file(os.path.join(step, fn)))
    assert any(n.startswith("moment1.vision.") for n in names) and not any("shard." in n for n in names)


@pytest.fixture(scope="module")
def four_rank(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("rt4"))
    p4 = ("parallel_config.pipeline_stage=4",)
    # V-shape on 4 ranks: 8 llm chunks of one layer, M >= 2P - 1
    p4v = p4 + ("parallel_config.pp_interleave_num=2", "mpipe.profile.regions.1.layers=8",
                "model.llm_layers=8",
                "parallel_config.micro_batch_num=8")
    dp = ("parallel_config.data_parallel=2",)
    cases = {"p4": _case(tmp, "transpose", False, p4), "p4_central": _case(tmp, "transpose(backward=central)", False, p4),
             "p4_spill_frozen": _case(tmp, SPILL_BALANCED, True, p4),
             "p4_dualpipev": _case(tmp, "transpose(order=dualpipev)", False, p4v),
             "p4_zbv": _case(tmp, "zbv", False, p4v),
             "p4_sharded": _case(tmp, SHARDED, False, p4),
             # P=2 x D=2 in the same launch: each case addresses the ranks by its own data_parallel
             "dp2": _case(tmp, "transpose", False, dp), "dp2_frozen": _case(tmp, "transpose", True, dp),
             "dp2_sharded": _case(tmp, SHARDED, False, dp),
             # ZeRO over the data-parallel pairs (issue 37), the encoder's replicas included
             "dp2_zero1": _case(tmp, "transpose", False, dp + ("train.zero=1",)),
             "dp2_zero2": _case(tmp, "transpose", False, dp + ("train.zero=2",))}
    launch_cases(tmp, list(cases.values()), 4, timeout=1500)
    return cases, {"p4": p4, "p4_central": p4, "p4_spill_frozen": p4, "p4_dualpipev": p4v, "p4_zbv": p4v,
                   "p4_sharded": p4, "dp2": dp, "dp2_frozen": dp, "dp2_sharded": dp,
                   "dp2_zero1": dp + ("train.zero=1",), "dp2_zero2": dp + ("train.zero=2",)}


FOUR = ["p4", "p4_central", "p4_spill_frozen", "p4_dualpipev", "p4_zbv", "p4_sharded", "dp2", "dp2_frozen",
        "dp2_sharded", "dp2_zero1", "dp2_zero2"]


@pytest.mark.msrun
@pytest.mark.parametrize("which", FOUR)
def test_four_ranks_match_reference(four_rank, which):
    cases, extra = four_rank
    assert_matches_reference(cases[which], which.endswith("frozen"), extra[which])


# -- per-rank memory (issue 23): the cost model's prediction equals what every rank measured -------------

MEMORY_2 = CASES_2 + [(SPILL, True), (UNEVEN, False), (SHARDED, False)]


@pytest.mark.msrun
@pytest.mark.parametrize("schedule,frozen", MEMORY_2, ids=[f"{s}-{'frozen' if fz else 'trained'}" for s, fz in MEMORY_2])
def test_two_ranks_memory_predicted_equals_measured(two_rank, schedule, frozen):
    case = two_rank[case_name(f"{schedule}_{'frozen' if frozen else 'trained'}_")]
    assert_memory_predicted(case, load_recipe(RECIPE, overrides=_overrides(schedule, frozen)))


@pytest.mark.msrun
@pytest.mark.parametrize("which", FOUR)
def test_four_ranks_memory_predicted_equals_measured(four_rank, which):
    cases, extra = four_rank
    case = cases[which]
    assert_memory_predicted(case, load_recipe(RECIPE, overrides=_overrides(case["schedule"], which.endswith("frozen"),
                                                                          extra[which])))


@pytest.mark.msrun
def test_memory_records_tell_schedules_apart(two_rank):
    # what the predicted = measured tests pin down, in numbers: transpose holds the encoder's forwards on
    # both ranks and its replica's state on both; 1F1B holds them on rank 0 only
    from helpers import measured_memory
    tr = measured_memory(two_rank[case_name("transpose_trained_")]["dump_dir"])
    one = measured_memory(two_rank[case_name("1f1b_trained_")]["dump_dir"])
    assert [tr[r][0]["peak_held"] for r in (0, 1)] == [{"vision": 2, "llm": 2}, {"vision": 2, "llm": 1}]
    assert [one[r][0]["peak_held"] for r in (0, 1)] == [{"vision": 2, "llm": 2}, {"vision": 0, "llm": 1}]
    assert tr[1][0]["optimizer_bytes"] > one[1][0]["optimizer_bytes"]
    assert tr[0][0]["optimizer_bytes"] == 2 * tr[0][0]["grads_bytes"] == 2 * tr[0][0]["params_bytes"]
