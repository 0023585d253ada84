"""Tensor parallelism inside a stage (``parallel_config.model_parallel: T``, issue 37 point 1) on the tiny
Qwen2.5-VL: Megatron column/row-parallel attention and MLP, vocabulary-parallel embedding, LM head and cross
entropy, the encoder replicated within each stage's T ranks.

* refusals before launch: a T that does not divide the heads or channels (a vocabulary it does not divide is
  padded to a multiple of T, the padded logits out of the loss, checkpoints unpadded), a model without
  tensor-parallel layers, Qwen3-VL, tied embeddings; ``HP_MSRUN_ARGS --worker_num`` other than P x D x T;
* the rank layout: each stage replica's T ranks are neighbours, the groups are the ones the comm module builds;
* equivalence (msrun): T=2 P=1 D=1 (2 ranks) and T=2 P=2 (4 ranks: 1f1b, transpose, zb_h1) train 3 steps like the
  single-process float32 reference (mindone's whole model): losses within 1e-5 relative, every gradient
  (sharded ones gathered whole) within 1e-5 at the first step.
"""
import os
import types

import pytest

from helpers import assert_equivalent, case_name, job_case, launch_cases, reference_run, run_main

HERE = os.path.dirname(os.path.abspath(__file__))
Q25 = os.path.join(HERE, "..", "..", "recipes", "qwen2_5_vl_tiny.yaml")
Q3 = os.path.join(HERE, "..", "..", "recipes", "qwen3_vl_tiny.yaml")
TINY = os.path.join(HERE, "..", "..", "recipes", "tiny_mllm.yaml")
STEPS = 3
T2 = ("parallel_config.model_parallel=2",)
T4 = ("parallel_config.model_parallel=4",)   # > num_key_value_heads (2): each key/value head on 2 ranks
P1 = ("parallel_config.pipeline_stage=1",)
D2 = ("parallel_config.data_parallel=2",)
Z1 = ("parallel_config.optimizer_shard=true",)   # ZeRO level 1
V255 = ("model.model_config.text_config.vocab_size=255",)   # T=2 does not divide it: padded to 256
M2 = ("parallel_config.micro_batch_num=2",)
# zb_h1: B and W split (f's gradient hook fires once, in B)
SCHEDULES_P2 = ("1f1b", "transpose", "zb_h1")


@pytest.fixture(scope="module")
def mindone():
    pytest.importorskip("mindone", reason="mindone is not installed")


@pytest.fixture(scope="module")
def demo(tmp_path_factory, mindone):
    from hyperparallel.data.demo import write_demo
    paths = write_demo(str(tmp_path_factory.mktemp("tpdemo")), 48, seed=3)
    return tuple(f"data.{k}={v}" for k, v in sorted(paths.items()))


@pytest.fixture
def refused(demo):
    def refusal(path, *sets):
        from hyperparallel.errors import SpecError
        from hyperparallel.runconfig import load_parsed
        with pytest.raises(SpecError) as e:
            load_parsed(path, list(demo if path != TINY else ()) + list(sets)).run
        return e.value
    return refusal


def test_t_that_does_not_divide_the_heads_is_refused_naming_the_key_and_the_allowed_values(refused):
    e = refused(Q25, "parallel_config.model_parallel=3")
    assert e.field == "parallel_config.model_parallel"
    # num_attention_heads 4, num_key_value_heads 2 (4: each key/value head on 2 ranks), intermediate 128, vocab 256
    assert "3 does not divide model.model_config.text_config.num_attention_heads (4); allowed: 1, 2, 4" in str(e)


def test_a_vocabulary_t_does_not_divide_is_padded_not_refused(demo):
    """vocab 255 under T=2 (and 4): the embedding and LM head padded to 256 rows, 128 (64) a rank; their whole
    (file) shape stays 255 rows. The heads still bound T: 3 is refused naming the key and the allowed values."""
    from hyperparallel.runconfig import load_parsed
    from hyperparallel.runtime.tensor_group import length_of, split_of, whole_shape
    V = ("model.model_config.text_config.vocab_size=255",)
    for T in (2, 4):
        rc = load_parsed(Q25, list(demo) + [f"parallel_config.model_parallel={T}"] + list(V)).run
        spec = rc.model.tensor_parallel_split(T)
        for name in ("lm_head.weight", "model.language_model.embed_tokens.weight"):
            assert spec[name] == (0, T, 255) and split_of(spec[name], T) == (0, T) and length_of(spec[name]) == 255
            assert whole_shape((256 // T, 64), spec[name], T) == (255, 64)
        assert spec["model.language_model.layers.0.mlp.down_proj.weight"] == 1   # the rest as before
    with pytest.raises(Exception) as e:
        load_parsed(Q25, list(demo) + ["parallel_config.model_parallel=3"] + list(V)).run
    assert e.value.field == "parallel_config.model_parallel"
    assert "3 does not divide model.model_config.text_config.num_attention_heads (4); allowed: 1, 2, 4" in str(e.value)


def test_models_and_settings_without_tensor_parallel_layers_are_refused(refused):
    assert "no tensor-parallel layers; allowed: 1" in str(refused(TINY, *T2))
    e = refused(Q3, *T2, "model.model_config.text_config.attention_bias=true")
    assert e.field == "parallel_config.model_parallel" and "attention_bias: true is not done" in str(e)
    e = refused(Q25, *T2, "model.model_config.tie_word_embeddings=true",
                 "model.model_config.text_config.tie_word_embeddings=true")
    assert "tied word embeddings" in str(e)


def test_model_parallel_must_be_a_whole_number(refused):
    e = refused(Q25, "parallel_config.model_parallel=0")
    assert e.field == "parallel_config.model_parallel" and "whole number" in str(e)


def test_the_cli_refuses_a_bad_t_before_launch_with_exit_2(demo, tmp_path):
    sets = [a for kv in demo for a in ("--set", kv)]
    p = run_main("train", Q25, *sets, "--set", "parallel_config.model_parallel=3", "--run-dir", str(tmp_path / "run"))
    assert p.returncode == 2, p.stderr
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "parallel_config.model_parallel" in err[0] and "allowed: 1, 2" in err[0], p.stderr
    assert not os.path.exists(tmp_path / "run" / "log")


def test_worker_num_must_be_p_x_d_x_t(mindone, monkeypatch):
    from hyperparallel.errors import SpecError
    from hyperparallel.launch import msrun_overrides
    from hyperparallel.recipe import load_recipe
    recipe = load_recipe(Q25, list(T2))
    assert recipe.ranks == 4   # P=2 x D=1 x T=2
    monkeypatch.setenv("HP_MSRUN_ARGS", "--worker_num=2")
    with pytest.raises(SpecError) as e:
        msrun_overrides(recipe.ranks)
    assert "pipeline_stage x data_parallel x model_parallel = 4 ranks; allowed: 4" in str(e.value)


def test_the_cli_refuses_ranks_other_than_p_x_d_x_t_before_launch_with_exit_2(demo, tmp_path):
    sets = [a for kv in demo + T2 + D2 for a in ("--set", kv)]   # P=2 x D=2 x T=2 = 8 ranks
    p = run_main("train", Q25, *sets, "--run-dir", str(tmp_path / "run"), env={"HP_MSRUN_ARGS": "--worker_num=4"})
    assert p.returncode == 2, p.stderr
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "HP_MSRUN_ARGS --worker_num: 4 but the plan needs parallel_config.pipeline_stage x " \
        "data_parallel x model_parallel = 8 ranks; allowed: 8" in err[0], p.stderr
    assert not os.path.exists(tmp_path / "run" / "log")


def test_bench_and_profile_refuse_t_before_launch(demo, tmp_path):
    sets = [a for kv in demo + T2 for a in ("--set", kv)]
    p = run_main("bench", Q25, *sets, "--out", str(tmp_path / "b.json"))
    assert p.returncode == 2 and "parallel_config.model_parallel: 2: hyperparallel bench runs without tensor " \
                                 "parallelism; allowed: 1" in p.stderr, p.stderr
    p = run_main("profile", Q25, *sets)
    assert p.returncode == 2 and "hyperparallel profile runs without tensor parallelism" in p.stderr, p.stderr
    # a model without tensor-parallel layers: the model's own refusal
    p = run_main("bench", TINY, "--set", T2[0], "--out", str(tmp_path / "b.json"))
    assert p.returncode == 2 and "no tensor-parallel layers; allowed: 1" in p.stderr, p.stderr


def test_the_plan_carries_t_and_the_ranks():
    from hyperparallel.recipe import derive_recipe, load_recipe
    plan = derive_recipe(load_recipe(TINY, ["parallel_config.model_parallel=2", "parallel_config.data_parallel=2"]))
    assert (plan.tensor_parallel, plan.ranks) == (2, plan.num_devices * 4)
    from hyperparallel.mpipe import ir
    again = ir.Plan.from_json(plan.to_json())
    assert again.tensor_parallel == 2
    plain = derive_recipe(load_recipe(TINY, []))
    assert plain.tensor_parallel == 1 and "tensor_parallel" not in plain.meta   # T=1 plans are as before


def _comm(rank, world, D, T):
    pytest.importorskip("mindspore")
    from hyperparallel.runtime.comm import Comm
    c = Comm.__new__(Comm)
    c.rank, c.world, c._groups = rank, world, {}
    c._place(D, T)
    return c


def test_rank_layout_puts_each_stage_replicas_t_ranks_side_by_side():
    # P=2 D=2 T=2: global = (device * D + dp) * T + tp
    c = _comm(5, 8, 2, 2)
    assert (c.device, c.dp_index, c.tp_index) == (1, 0, 1)
    assert c.tp_ranks() == (4, 5)
    assert c.dp_ranks() == (5, 7)
    assert c.global_rank(0) == 1   # the same dp and tp index on the peer stage
    assert c.ranks_of((0, 1)) == (1, 5)
    one = _comm(3, 4, 2, 1)   # T = 1: device * D + dp, as before
    assert (one.device, one.dp_index, one.global_rank(0), one.dp_ranks()) == (1, 1, 1, (2, 3))


def test_plan_groups_hold_the_tensor_parallel_groups():
    pytest.importorskip("mindspore")
    from hyperparallel.recipe import derive_recipe, load_recipe
    from hyperparallel.runtime.rank import plan_groups
    plan = derive_recipe(load_recipe(TINY, ["parallel_config.model_parallel=2", "parallel_config.data_parallel=2",
                                            "mpipe.schedule=transpose"]))
    groups = plan_groups(plan)
    assert {(0, 1), (2, 3), (4, 5), (6, 7)} <= groups          # tensor-parallel groups
    assert {(0, 2), (1, 3), (4, 6), (5, 7)} <= groups          # data-parallel groups of each tp index
    assert {(0, 4), (1, 5), (2, 6), (3, 7)} <= groups          # the encoder's replica groups


def test_counted_params_count_a_sharded_weight_on_every_tp_rank_and_a_copy_once():
    pytest.importorskip("mindspore")
    from hyperparallel.runtime.rank import counted_params
    plan = types.SimpleNamespace(chunks=[types.SimpleNamespace(region="llm", index=0, devices=[0])],
                                 tied_on=lambda d: [], tensor_parallel=2)
    cell = types.SimpleNamespace(get_parameters=lambda: [types.SimpleNamespace(name="w"),
                                                         types.SimpleNamespace(name="norm")])
    chunks = {("llm", 0): cell}
    assert counted_params(plan, chunks, 0, 0, None, 0, {"w": 0}) == {"w", "norm"}
    assert counted_params(plan, chunks, 0, 0, None, 1, {"w": 0}) == {"w"}
    plan.tensor_parallel = 4   # "w" in 2 slices, each on 2 ranks (key/value heads replicated): counted on 0 and 2
    assert [counted_params(plan, chunks, 0, 0, None, t, {"w": (0, 2)}) for t in range(4)] == \
        [{"w", "norm"}, set(), {"w"}, set()]


def test_a_slice_held_by_several_ranks_is_gathered_and_sliced_by_its_parts():
    pytest.importorskip("mindspore")
    from hyperparallel.runtime import compat
    compat.setup_device("CPU")   # before any kernel (blocking launch), as every in-process test of MindSpore
    import numpy as np
    from mindspore import Tensor
    from hyperparallel.runtime.tensor_group import gather_whole, my_slice, whole_shape
    whole = Tensor(np.arange(24, dtype=np.float32).reshape(4, 6))
    # T = 4, two parts along axis 0: ranks 0, 1 hold rows 0-1, ranks 2, 3 rows 2-3
    assert [my_slice(whole, (0, 2), 4, t).asnumpy()[0, 0] for t in range(4)] == [0, 0, 12, 12]
    assert whole_shape((2, 6), (0, 2), 4) == (4, 6) and whole_shape((4, 3), 1, 2) == (4, 6)

    class Group:   # the four ranks' slices, as all_gather returns them
        T = 4

        def all_gather(self, t, group):
            return [my_slice(whole, (0, 2), 4, r) for r in range(4)]
    got = gather_whole(Group(), {"w": my_slice(whole, (0, 2), 4, 1), "n": Tensor([1.0])}, {"w": (0, 2)})
    assert (got["w"].asnumpy() == whole.asnumpy()).all() and got["n"].asnumpy()[0] == 1.0
    # a padded spec: 3 rows over T = 2, padded to 4: rank 1 holds row 2 and a zero row; gathered, 3 rows again
    three = Tensor(np.arange(18, dtype=np.float32).reshape(3, 6))
    slices = [my_slice(three, (0, 2, 3), 2, t) for t in range(2)]
    assert [s.shape for s in slices] == [(2, 6), (2, 6)] and (slices[1].asnumpy()[1] == 0).all()
    assert (slices[1].asnumpy()[0] == three.asnumpy()[2]).all()

    class Two:
        T = 2

        def all_gather(self, t, group):
            return slices
    back = gather_whole(Two(), {"e": slices[0]}, {"e": (0, 2, 3)})["e"]
    assert back.shape == (3, 6) and (back.asnumpy() == three.asnumpy()).all()


# -- equivalence on msrun ranks ------------------------------------------------------------------------

def _sets(demo, extra):
    return list(demo) + [f"train.steps={STEPS}", "mpipe.encoder.trainable=true"] + list(M2) + list(extra)


def _key(path, schedule, extra):
    return case_name(f"tp_{os.path.basename(path).split('_tiny')[0]}_{schedule}_{'_'.join(extra)}")


def _case(tmp, demo, schedule, extra, path=Q25, **kw):
    return job_case(tmp, path, schedule, _key(path, schedule, extra), _sets(demo, extra), steps=STEPS, chunks="jit",
                    extra=list(extra), recipe=path, **kw)


_REF = {}


def _reference(demo, extra=(), path=Q25):
    """(losses, first grads, every step's grads) of the single-process reference: mindone's whole model,
    unsharded, one process (it never splits its layers; T in the recipe does not change it)."""
    key = (path, tuple(extra))
    if key not in _REF:
        from hyperparallel.recipe import load_recipe
        _REF[key] = reference_run(load_recipe(path, _sets(demo, extra)), STEPS)
    return _REF[key]


def _check(demo, case):
    dp = tuple(e for e in case["extra"] if e.startswith(("parallel_config.data_parallel=", V255[0])))
    losses, grads, per_step = _reference(demo, dp, path=case["recipe"])
    got = assert_equivalent(case, losses, grads, per_step)
    assert any(k.startswith("model.visual.") for k in got)
    return got


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, demo):
    """An unsharded checkpoint: a Hugging Face directory (``save_pretrained``) of the tiny Qwen2.5-VL with other
    weights than the recipe's seed gives."""
    from hyperparallel.runtime import compat
    from hyperparallel.runconfig import load_parsed
    compat.setup_device("CPU")
    rc = load_parsed(Q25, _sets(demo, ()) + ["train.seed=123"]).run
    d = str(tmp_path_factory.mktemp("tphf"))
    rc.model.network().save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, demo, hf_dir):
    """T=2 P=1 D=1: one launch of 2 ranks. The plain case saves steps 2 and 3 (whole tensors); another case
    starts from the unsharded Hugging Face directory (each rank slices it)."""
    from hyperparallel.runtime.ckpt_files import resolve
    tmp = str(tmp_path_factory.mktemp("tp2"))
    cases = [_case(tmp, demo, "1f1b", T2 + P1, save_dir=os.path.join(tmp, "ckpt"), save_every=2),
             _case(tmp, demo, "1f1b", T2 + P1, dump_dir=os.path.join(tmp, "dump", "from_hf"),
                   resume_from=resolve(hf_dir).to_json()),
             _case(tmp, demo, "1f1b", T2 + P1, path=Q3),
             _case(tmp, demo, "1f1b", T2 + P1 + V255, save_dir=os.path.join(tmp, "ckpt255"), save_every=2)]
    launch_cases(tmp, cases, 2, timeout=600)
    return {os.path.basename(c["dump_dir"]): c for c in cases}


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory, demo, two_ranks):
    """T=2 P=2 D=1: one launch of 4 ranks, 1f1b, transpose and zb_h1 (Qwen3-VL: transpose); T=4 P=1 (key/value
    heads replicated on 2 ranks each); and 1f1b resumed from the 2-rank run's step 2
    (T=2 P=1: another layout of the same T) for its third step."""
    from hyperparallel.runtime.ckpt_files import resolve
    tmp = str(tmp_path_factory.mktemp("tp4"))
    saved = two_ranks[_key(Q25, "1f1b", T2 + P1)]["save_dir"]
    cases = [_case(tmp, demo, s, T2) for s in SCHEDULES_P2] + [_case(tmp, demo, "transpose", T2, path=Q3),
                                                                _case(tmp, demo, "1f1b", T4 + P1)]
    cases.append(_case(tmp, demo, "1f1b", T2, dump_dir=os.path.join(tmp, "dump", "resumed"),
                       resume_from=resolve(os.path.join(saved, "step_2")).to_json()))
    cases.append(_case(tmp, demo, "1f1b", T2 + P1 + D2))   # T=2 D=2: two data-parallel replicas of a T group
    cases.append(_case(tmp, demo, "1f1b", T2 + P1 + D2 + Z1))   # and ZeRO-1 over them
    saved255 = two_ranks[_key(Q25, "1f1b", T2 + P1 + V255)]["save_dir"]   # the padded vocabulary, resumed at P=2
    cases.append(_case(tmp, demo, "1f1b", T2 + V255, dump_dir=os.path.join(tmp, "dump", "resumed255"),
                       resume_from=resolve(os.path.join(saved255, "step_2")).to_json()))
    launch_cases(tmp, cases, 4, timeout=900)
    return {os.path.basename(c["dump_dir"]): c for c in cases}


def _assert_trains_like_reference(runs, demo, schedule, extra, path=Q25):
    case = runs[_key(path, schedule, extra)]
    T = 4 if T4[0] in extra else 2
    assert case["plan"]["meta"]["tensor_parallel"] == T
    grads = _check(demo, case)
    # every tensor-parallel rank of the last stage held (and dumped, gathered whole) the sharded weights
    assert "model.language_model.layers.0.self_attn.q_proj.weight" in grads and "lm_head.weight" in grads
    assert len(grads["lm_head.weight"]) == T * case["plan"]["data_parallel"]
    return grads


@pytest.mark.msrun
def test_t2_p1_d1_trains_like_the_single_process_reference(two_ranks, demo):
    grads = _assert_trains_like_reference(two_ranks, demo, "1f1b", T2 + P1)
    # each rank really holds half of every sharded weight (its memory record), the rest whole
    import json
    from hyperparallel.models.qwen_vl.tp import sharded
    split = sharded(4, 2, 2)
    assert {"lm_head.weight", "model.language_model.embed_tokens.weight",
            "model.language_model.layers.3.mlp.down_proj.weight"} <= set(split)
    want = sum(g[0].size * 4 // (2 if n in split else 1) for n, g in grads.items())
    case = two_ranks[_key(Q25, "1f1b", T2 + P1)]
    for rank in (0, 1):
        with open(os.path.join(case["dump_dir"], f"memory_rank{rank}.json")) as f:
            assert json.load(f)[0]["params_bytes"] == want


@pytest.mark.msrun
@pytest.mark.parametrize("schedule", SCHEDULES_P2)
def test_t2_p2_trains_like_the_single_process_reference(four_ranks, demo, schedule):
    _assert_trains_like_reference(four_ranks, demo, schedule, T2)


@pytest.mark.msrun
@pytest.mark.parametrize("schedule,extra", [(s, T2) for s in SCHEDULES_P2] + [("1f1b", T4 + P1), ("1f1b", T2 + P1 + D2),
                                                                         ("1f1b", T2 + P1 + D2 + Z1)],
                         ids=[f"T2-P2-{s}" for s in SCHEDULES_P2] + ["T4-P1", "T2-P1-D2", "T2-P1-D2-zero1"])
def test_every_tensor_parallel_rank_holds_the_bytes_the_cost_model_predicts(four_ranks, demo, schedule, extra):
    """Every rank of every step: its parameter, grad and optimizer bytes are ``static_memory``'s share of the
    chunks' real bytes under T (the split weights 1/T, k/v 1/kv under T=4, the norms whole), its held forwards
    the cost model's and its held bytes the predicted peak of its (whole) boundary tensors."""
    from helpers import assert_memory_predicted, measured_memory
    from hyperparallel.recipe import load_recipe
    case = four_ranks[_key(Q25, schedule, extra)]
    assert_memory_predicted(case, load_recipe(Q25, _sets(demo, extra)))
    got = measured_memory(case["dump_dir"])
    # the split is real: a T group's ranks hold less than the whole chunk, and the same
    T = case["plan"]["meta"]["tensor_parallel"]
    assert len({m[0]["params_bytes"] for r, m in got.items() if r < T}) == 1


@pytest.mark.msrun
@pytest.mark.parametrize("zero", [(), Z1], ids=["plain", "optimizer_shard"])
def test_t2_d2_trains_like_the_single_process_reference(four_ranks, demo, zero):
    """T=2 D=2 P=1 (4 ranks): two data-parallel replicas of one tensor-parallel group (with
    ``parallel_config.optimizer_shard: true`` each rank's Adam state sharded over its data-parallel peer); the
    reference runs the D x M micro-batches of a step in one process."""
    grads = _assert_trains_like_reference(four_ranks, demo, "1f1b", T2 + P1 + D2 + zero)
    plan = four_ranks[_key(Q25, "1f1b", T2 + P1 + D2 + zero)]["plan"]
    assert len(grads["lm_head.weight"]) == 4 and plan["data_parallel"] == 2
    assert plan["meta"].get("zero", {}).get("level", 0) == (1 if zero else 0)


@pytest.mark.msrun
def test_a_padded_vocabulary_checkpoint_resumes_under_another_layout(four_ranks, demo):
    """vocab 255: the T=2 P=1 step-2 checkpoint (255-row tensors) resumed at T=2 P=2, each rank padding its
    slice again: the third step's loss is the unpadded reference's."""
    import json
    import numpy as np
    with open(os.path.join(four_ranks["resumed255"]["dump_dir"], "losses.json")) as f:
        got = json.load(f)
    assert got["start"] == 2 and len(got["losses"]) == 1
    np.testing.assert_allclose(got["losses"][0], _reference(demo, V255)[0][2], rtol=1e-5)


@pytest.mark.msrun
@pytest.mark.parametrize("P", [1, 2], ids=["T2-P1-1f1b", "T2-P2-transpose"])
def test_qwen3_vl_tensor_parallel_trains_like_the_single_process_reference(two_ranks, four_ranks, demo, P):
    """Qwen3-VL: per-head q_norm / k_norm (their gradients summed over the group) and deepstack features added
    to the (replicated) hidden state of the first layers."""
    runs, schedule, extra = (two_ranks, "1f1b", T2 + P1) if P == 1 else (four_ranks, "transpose", T2)
    grads = _assert_trains_like_reference(runs, demo, schedule, extra, path=Q3)
    assert "model.language_model.layers.0.self_attn.q_norm.weight" in grads
    assert any(k.startswith("model.visual.deepstack_merger_list.") for k in grads)


@pytest.mark.msrun
def test_a_padded_vocabulary_trains_like_the_unpadded_reference_and_saves_it_unpadded(two_ranks, demo):
    """vocab 255 under T=2: each rank 128 rows of the embedding and LM head (rank 1's last a zero row whose
    logit is left out of the loss): losses and every gradient (255 rows, gathered and cut) equal mindone's
    unpadded model's, every rank's bytes are static_memory's (128 rows of each, padding counted); the step-2 checkpoint holds 255-row weights and moments, and the unpadded reference
    restored from it gives the run's third loss."""
    import json
    import numpy as np
    import mindspore as ms
    from hyperparallel.recipe import load_recipe
    from hyperparallel.runconfig import RunConfig
    from hyperparallel.runtime.ckpt_files import resolve
    from hyperparallel.runtime.reference import Reference
    from helpers import assert_memory_predicted
    case = two_ranks[_key(Q25, "1f1b", T2 + P1 + V255)]
    grads = _assert_trains_like_reference(two_ranks, demo, "1f1b", T2 + P1 + V255)
    assert grads["lm_head.weight"][0].shape == (255, 64)
    # each rank holds 128 rows (the padding included), as static_memory counts them
    assert_memory_predicted(case, load_recipe(Q25, _sets(demo, T2 + P1 + V255)))
    src = resolve(os.path.join(case["save_dir"], "step_2"))
    saved = ms.load_checkpoint(src.files[0], format="safetensors")
    for n in ("lm_head.weight", "model.language_model.embed_tokens.weight"):
        assert saved[n].shape == (255, 64) and any(k.endswith(n) and k != n and saved[k].shape == (255, 64)
                                                    for k in saved), n   # the weight and its Adam moments
    recipe = load_recipe(Q25, _sets(demo, V255))
    fresh = Reference(RunConfig.from_raw(recipe.raw), recipe.micro_batch_num, {"vision": True, "llm": True})
    assert fresh.restore(src) == (2, True)
    loss, _ = fresh.step(2)
    with open(os.path.join(case["dump_dir"], "losses.json")) as f:
        np.testing.assert_allclose(loss, json.load(f)["losses"][2], rtol=1e-5)


# -- checkpoints: whole tensors, interchangeable with unsharded runs -------------------------------------

@pytest.mark.msrun
def test_a_tensor_parallel_checkpoint_is_what_an_unsharded_run_saves(two_ranks, demo):
    """Step 2 of the T=2 run: one file (tp index 0 writes), every name of the whole model with its whole shape,
    and the weights and Adam state an unsharded single-process run has after 2 steps (float32 rounding of the
    two summation orders, through 2 Adam updates)."""
    import numpy as np
    import mindspore as ms
    from hyperparallel.runconfig import load_parsed
    from hyperparallel.runtime.ckpt_files import resolve
    from hyperparallel.runtime.reference import Reference
    case = two_ranks[_key(Q25, "1f1b", T2 + P1)]
    src = resolve(os.path.join(case["save_dir"], "step_2"))
    assert [os.path.basename(f) for f in src.files] == ["rank_0.safetensors"]
    saved = ms.load_checkpoint(src.files[0], format="safetensors")
    recipe = load_parsed(Q25, _sets(demo, ()))
    ref = Reference(recipe.run, recipe.micro_batch_num, {"vision": True, "llm": True})
    for s in range(2):
        ref.step(s)
    want = {p.name: p.asnumpy() for p in ref.all_params()}
    weights = set(want)
    want.update({n: v.asnumpy() for n, v in ref.opt.state().items()})
    assert set(want) <= set(saved), sorted(set(want) - set(saved))[:5]
    lr = recipe.raw["train"]["lr"]
    for n, w in want.items():
        got = saved[n].asnumpy()
        assert got.shape == w.shape, n
        # a weight: within 1% of one Adam step (lr) -- Adam's m / sqrt(v) of a gradient near zero moves with the
        # float32 rounding of the two summation orders (measured: 2.1e-5 on one element of 8,192, lr 3e-3); a
        # wrong slice or an unsummed partial gradient is off by whole steps. Moments: 1e-4 of their scale.
        tol = 0.01 * lr if n in weights else 0.0
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=max(tol, 1e-4 * max(float(np.abs(w).max()), 1e-12)),
                                   err_msg=n)
    # and the unsharded reference loads it (restore: names and shapes checked) and gives the TP run's 3rd loss
    fresh = Reference(recipe.run, recipe.micro_batch_num, {"vision": True, "llm": True})
    step, with_state = fresh.restore(src)
    assert (step, with_state) == (2, True)
    loss, _ = fresh.step(2)
    with open(os.path.join(case["dump_dir"], "losses.json")) as f:
        np.testing.assert_allclose(loss, __import__("json").load(f)["losses"][2], rtol=1e-5)


@pytest.mark.msrun
def test_an_unsharded_checkpoint_starts_a_tensor_parallel_run(two_ranks, demo, hf_dir):
    """A Hugging Face directory (whole tensors, the hub's names) resumed under T=2: each rank slices it; the run
    trains like the reference started from the same weights."""
    import numpy as np
    case = two_ranks["from_hf"]
    losses, grads, per_step = _reference(demo, (f"model.pretrained={hf_dir}",))
    assert_equivalent(case, losses, grads, per_step)
    assert not np.allclose(losses[0], _reference(demo)[0][0])   # other weights than the seed's


@pytest.mark.msrun
def test_a_tensor_parallel_checkpoint_resumes_under_another_layout(four_ranks, demo):
    """The T=2 P=1 step-2 checkpoint resumed with T=2 P=2: the third step's loss is the reference's."""
    import json
    import numpy as np
    with open(os.path.join(four_ranks["resumed"]["dump_dir"], "losses.json")) as f:
        got = json.load(f)
    assert got["start"] == 2 and len(got["losses"]) == 1
    np.testing.assert_allclose(got["losses"][0], _reference(demo)[0][2], rtol=1e-5)


@pytest.mark.msrun
def test_t_above_the_key_value_heads_replicates_each_on_t_over_kv_ranks(four_ranks, demo):
    """T=4 with 2 key/value heads: each rank has one query head and the key/value head it reads, held by 2
    ranks whose gradients of it are summed; trains like the reference."""
    grads = _assert_trains_like_reference(four_ranks, demo, "1f1b", T4 + P1)
    assert len(grads["model.language_model.layers.0.self_attn.k_proj.weight"]) == 4
