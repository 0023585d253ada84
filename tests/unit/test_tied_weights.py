"""Tied word embeddings (issue 40): one logical parameter across pipeline stages, as plan data.

The recipe front end reads ``tie_word_embeddings`` of the language model's own config into the profile;
the derivation places the copies (``plan.tied``) and emits one ``ALLREDUCE tied`` over the devices
holding a copy, after their last weight grads, on those devices only; two copies on one device (V-shape
orders) are one parameter and need no collective. The checker refuses a plan that misses or misplaces
it; the cost model times it and counts the copy's memory on every holder. (Training equality with the
reference: the equivalence suites.)
"""
import os
from dataclasses import replace

import pytest

from helpers import profile
from hyperparallel.mpipe import derive
from hyperparallel.mpipe.check import check
from hyperparallel.mpipe.cost import simulate
from hyperparallel.errors import SpecError
from hyperparallel.mpipe.ir import ALLREDUCE, DP_GROUP, TIED, W, WGRAD, Plan
from hyperparallel.mpipe.profile import TiedWeight, parse_profile
from hyperparallel.recipe import load_recipe, checked_plan

HERE = os.path.dirname(os.path.abspath(__file__))
Q25 = os.path.join(HERE, "..", "..", "recipes", "qwen2_5_vl_tiny.yaml")
LLAMA = os.path.join(HERE, "..", "..", "recipes", "mf_llama_mllm.yaml")
TIE_Q = ("model.model_config.tie_word_embeddings=true", "model.model_config.text_config.tie_word_embeddings=true")


def _tied_profile(mb=4.0, link=None):
    p = profile(("vision", 2, True), ("llm", 8, True), link=link)
    return replace(p, tied=(TiedWeight("word_embeddings", "llm", (0, 7), mb),))


def _tied_reduces(plan):
    return {d: [(i, a.group) for i, a in enumerate(prog) if a.kind == ALLREDUCE and a.tensor == TIED]
            for d, prog in plan.programs.items()}


@pytest.mark.parametrize("schedule,V", [("1f1b", 1), ("interleaved", 2), ("transpose", 1),
                                        ("transpose(backward=central)", 1)])
def test_tied_all_reduce_is_derived_over_the_holders_only_after_their_weight_grads(schedule, V):
    plan = derive(_tied_profile(), schedule, 4, 8, V)
    assert check(plan) == []
    (t,) = plan.tied
    assert (t.region, t.chunks, t.devices) == ("llm", (0, 4 * V - 1), (0, 3))
    got = _tied_reduces(plan)
    assert [len(got[d]) for d in range(4)] == [1, 0, 0, 1]   # devices 1, 2 hold no copy: not in it
    for d in (0, 3):
        i, group = got[d][0]
        assert group == (0, 3)
        assert not any(a.kind == W or a.kind == "BW" for a in plan.programs[d][i + 1:] if a.region == "llm")
    assert Plan.from_json(plan.to_json()).tied == plan.tied   # round trip


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_v_shape_orders_hold_both_copies_on_one_device_and_reduce_nothing(schedule):
    plan = derive(_tied_profile(), schedule, 2, 4, 2)
    assert check(plan) == []
    assert plan.tied[0].devices == (0,) and plan.tied[0].chunks == (0, 3)
    assert all(not v for v in _tied_reduces(plan).values())


def test_data_parallel_keeps_the_tied_all_reduce_within_each_replica():
    """D=2 x P=2: each replica sums its own two copies (global ranks 0+2 and 1+3; device d holds ranks 2d, 2d+1),
    before the data-parallel all-reduce sums the replicas."""
    plan = derive(_tied_profile(), "1f1b", 2, 4, 1, 2)
    assert check(plan) == [] and plan.tied[0].devices == (0, 1)
    for d in (0, 1):
        kinds = [(a.tensor, a.group) for a in plan.programs[d] if a.kind == ALLREDUCE]
        assert kinds.index((TIED, (0, 1))) < kinds.index((WGRAD, DP_GROUP))
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    from hyperparallel.runtime.rank import plan_groups
    assert {(0, 2), (1, 3), (0, 1), (2, 3)} <= plan_groups(plan)   # tied per replica; each device's replicas


def test_untied_model_plans_no_tied_collective():
    plan = derive(profile(("vision", 2, True), ("llm", 8, True)), "1f1b", 2, 4)
    assert plan.tied == [] and all(not v for v in _tied_reduces(plan).values())
    assert "tied" not in plan.to_json()   # plan files of untied models unchanged


def test_checker_refuses_a_missing_or_early_tied_all_reduce():
    plan = derive(_tied_profile(), "1f1b", 2, 4)
    missing = replace(plan, programs={d: [a for a in p if a.tensor != TIED] for d, p in plan.programs.items()})
    errs = check(missing)
    assert errs and "ALLREDUCE tied" in errs[0] and "expected exactly one" in errs[0], errs
    early = {}
    for d, p in plan.programs.items():
        ar = [a for a in p if a.tensor == TIED]
        rest = [a for a in p if a.tensor != TIED]
        early[d] = ar + rest   # before every backward
    errs = check(replace(plan, programs=early))
    assert errs and "whose weight grads of word_embeddings it must sum" in errs[0], errs
    frozen = derive(replace(_tied_profile(), regions=tuple(replace(r, trainable=False) for r in
                                                           _tied_profile().regions)), "1f1b", 2, 4)
    assert all(not v for v in _tied_reduces(frozen).values())   # a frozen LLM: no grads to sum


def test_cost_times_the_tied_all_reduce_and_counts_the_copy_on_every_holder():
    link = {"latency_ms": 0.1, "bandwidth_gb_s": 1.0}
    tied, plain = _tied_profile(mb=64.0, link=link), profile(("vision", 2, True), ("llm", 8, True), link=link)
    rep_t, rep_p = simulate(derive(tied, "1f1b", 2, 4), tied), simulate(derive(plain, "1f1b", 2, 4), plain)
    comm = [t for t in rep_t.execution.timeline[0] if t.lane == "comm" and t.action.tensor == TIED]
    assert len(comm) == 1 and comm[0].end - comm[0].start == pytest.approx(2 * 0.1 + 64.0 / 1024 * 1000)
    for d in (0, 1):   # each holder: the copy, its grad and Adam's two moments
        a, b = rep_t.devices[d], rep_p.devices[d]
        assert (a.params_mb - b.params_mb, a.grads_mb - b.grads_mb, a.optimizer_mb - b.optimizer_mb) == \
            pytest.approx((64.0, 64.0, 128.0))
    from hyperparallel.mpipe.draw import trace_events, COMM_TID
    drawn = [e for e in trace_events([(derive(tied, "1f1b", 2, 4), rep_t)]) if e.get("ph") == "X"
             and e["name"] == "ALLREDUCE tied llm group=[0, 1]"]
    assert len(drawn) == 2 and all(e["tid"] == COMM_TID for e in drawn)   # the comm lane of both holders
    v = simulate(derive(_tied_profile(64.0, link), "zbv", 2, 4, 2), _tied_profile(64.0, link))
    v0 = simulate(derive(replace(plain), "zbv", 2, 4, 2), plain)
    assert v.devices[0].params_mb - v0.devices[0].params_mb == pytest.approx(64.0)   # one parameter on device 0
    assert v.devices[1].params_mb == pytest.approx(v0.devices[1].params_mb)


def test_recipes_tie_from_the_language_models_own_config_flag():
    r = load_recipe(Q25, list(TIE_Q))
    (t,) = r.profile.tied
    assert (t.name, t.region, t.layers) == ("word_embeddings", "llm", (0, 3))
    assert t.param_mb == pytest.approx(256 * 64 * 4 / 2 ** 20)   # vocab x hidden, float32
    assert checked_plan(r, "1f1b").tied[0].devices == (0, 1)
    assert load_recipe(Q25).profile.tied == ()
    # Qwen2.5-VL reads text_config's flag (a top-level true beside text_config's false ties nothing)
    assert load_recipe(Q25, [TIE_Q[0]]).profile.tied == ()
    assert load_recipe(LLAMA, ["model.model_config.tie_word_embeddings=true"]).profile.tied[0].layers == (0, 3)


def test_profile_tied_entries_are_checked():
    regions = [{"name": "llm", "layers": 4}]
    with pytest.raises(SpecError, match=r"mpipe.profile.tied\[0\].layers"):
        parse_profile({"regions": regions, "tied": [{"name": "e", "region": "llm", "layers": [0, 0]}]})
    with pytest.raises(SpecError, match=r"mpipe.profile.tied\[0\].region"):
        parse_profile({"regions": regions, "tied": [{"name": "e", "region": "vit", "layers": [0, 3]}]})
    p = parse_profile({"regions": regions, "tied": [{"name": "e", "region": "llm", "layers": [0, 3], "param_mb": 2}]})
    assert p.tied == (TiedWeight("e", "llm", (0, 3), 2.0),)


def test_a_plan_that_ties_what_the_model_does_not_is_refused_before_launch(tmp_path):
    pytest.importorskip("transformers")
    from hyperparallel.runconfig import load_parsed
    from hyperparallel.data.demo import write_demo
    paths = write_demo(str(tmp_path), 8, seed=3)
    r = load_parsed(Q25, [f"data.{k}={v}" for k, v in sorted(paths.items())])
    r.profile = replace(r.profile, tied=(TiedWeight("word_embeddings", "llm", (0, 3), 1.0),))
    with pytest.raises(SpecError, match=r"mpipe.profile.tied: the plan ties \['word_embeddings'\] but the "
                                        r"mindone .* model ties nothing"):
        r.run


def test_a_name_saved_twice_with_different_values_is_refused_not_picked(tmp_path):
    """What checkpoints written before this fix hold (the embedding in both rank files, trained apart):
    resume, ``ckpt --merge`` and ``--export-hf`` refuse it, naming the weight; equal copies pass."""
    pytest.importorskip("mindspore")
    import numpy as np
    import mindspore as ms
    from hyperparallel.runtime.checkpoint import check_one_value, merge
    from hyperparallel.runtime.ckpt_files import CheckpointError, Source
    name = "model.language_model.embed_tokens.weight"
    files = []
    for r, v in enumerate((1.0, 2.0)):
        f = str(tmp_path / f"rank_{r}.safetensors")
        ms.save_checkpoint([{"name": name, "data": ms.Tensor(np.full((2, 2), v, np.float32))},
                            {"name": f"other{r}", "data": ms.Tensor(np.zeros(2, np.float32))}], f, format="safetensors")
        files.append(f)
    src = Source(str(tmp_path), files, 2)
    with pytest.raises(CheckpointError, match=f"{name} is in rank_0.safetensors and rank_1.safetensors with "
                                              "different values"):
        check_one_value(src)
    with pytest.raises(CheckpointError, match="different values"):
        merge(src, str(tmp_path / "merged.safetensors"))
    ms.save_checkpoint([{"name": name, "data": ms.Tensor(np.full((2, 2), 1.0, np.float32))}], files[1],
                       format="safetensors")
    check_one_value(src)   # equal copies: one value
