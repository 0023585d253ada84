"""mindone's Qwen2.5-VL and Qwen3-VL pipelined on 2 and 4 msrun ranks train exactly like mindone's whole
model called as users call it (``model(input_ids=..., attention_mask=..., pixel_values=...,
image_grid_thw=..., labels=...)``, a micro-batch's videos as ``pixel_values_videos=..., video_grid_thw=...``
(Qwen2.5-VL: ``second_per_grid_ts=...``)), on the demo conversations laid out as Qwen's processor lays them
out: images of different sizes inside and across micro-batches, text-only samples, video samples (frame
lists and video files, alone and beside images in a micro-batch). Losses of 3 optimizer steps within 1e-5
relative, every step-0 gradient within 1e-5.

Launches: one on 2 ranks (Qwen2.5-VL: 1f1b, interleaved V=2, zb_h1, transpose owner and central, encoder
frozen and trained; activation recompute, full and layers=1; Qwen3-VL: transpose, and 1f1b with an uneven cut
that carries a deepstack feature across the LLM boundary; a run started from a Hugging Face directory; a run
that saves, exported to Hugging Face format afterwards; tied word embeddings: both models in every order, a
zbv checkpoint resumed under 1f1b; packed sequences, both models), one on 4 ranks (transpose P=4; tied: D=2 x
P=2, and the 2-rank zbv checkpoint resumed with P=4).
"""
import json
import os

import numpy as np
import pytest

pytest.importorskip("mindspore", reason="mindspore is not installed")
pytest.importorskip("mindone", reason="mindone is not installed")

from helpers import (LAST_STEP_TOL, _assert_grads, assert_equivalent, assert_memory_predicted,  # noqa: E402
                     measured_memory, case_name, compile_stats, dumped, job_case, launch_cases,
                     reference_run)
from hyperparallel.recipe import load_recipe  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
Q25 = os.path.join(HERE, "..", "..", "recipes", "qwen2_5_vl_tiny.yaml")
Q3 = os.path.join(HERE, "..", "..", "recipes", "qwen3_vl_tiny.yaml")
STEPS = 3
M2 = ("parallel_config.micro_batch_num=2",)   # 2 ranks: 2 micro-batches of 2 samples (fast); 4 ranks: the recipe's 4
INTERLEAVE = ("parallel.pipeline_config={pipeline_interleave: true, pipeline_scheduler: 1f1b}",
              "model.model_config.pp_interleave_num=2")
CASES_25 = [("1f1b", False, ()), ("1f1b", True, ()), ("interleaved", False, INTERLEAVE), ("zb_h1", False, ()),
            ("transpose", False, ()), ("transpose", True, ()), ("transpose(backward=central)", False, ()),
            ("transpose(backward=central)", True, ())]
UNEVEN = ("model.model_config.offset=[-1, 1]",)   # MindFormers' offset: LLM layers 1 + 3 on the two stages
CASES_3 = [("transpose", False, ()), ("1f1b", False, UNEVEN)]
# compiled chunks (issue 38.6: mpipe.compile: jit, qwen_vl/graph.py); every other case runs eager (the suites about
# other things); the reference is the same unpadded, eager one (shape buckets' fillers change nothing)
JIT = ("mpipe.compile=jit",)
BUCKETS = ("data.shape_buckets=pow2",)
JIT_CASES = [(Q25, "1f1b", False, JIT), (Q25, "zb_h1", False, JIT), (Q25, "transpose", False, JIT + BUCKETS),
             (Q3, "1f1b", False, UNEVEN + JIT)]
JIT_IDS = ["qwen2_5_vl-1f1b", "qwen2_5_vl-zb_h1", "qwen2_5_vl-transpose-buckets", "qwen3_vl-1f1b-uneven"]
P4 = ("parallel_config.pipeline_stage=4",)
D2 = ("parallel_config.data_parallel=2",)   # 4 ranks: D=2 x P=2, 2 micro-batches each (the global batch of 4)
# tied word embeddings (issue 40): the embedding is the LM head; every order equals the reference. V-shape
# orders (rank 0 holds both ends: one Parameter) need M >= 2P - 1: 4 micro-batches
TIE = ("model.model_config.tie_word_embeddings=true", "model.model_config.text_config.tie_word_embeddings=true")
TIE3 = ("model.model_config.text_config.tie_word_embeddings=true",)
TIED_25 = [("1f1b", TIE, M2), ("interleaved", TIE + INTERLEAVE, M2), ("transpose", TIE, M2),
           ("transpose(backward=central)", TIE, M2), ("zbv", TIE + INTERLEAVE, ()), ("dualpipev", TIE + INTERLEAVE, ())]
TIED_3 = [("1f1b", TIE3, M2), ("interleaved", TIE3 + INTERLEAVE, M2), ("transpose", TIE3, M2),
          ("transpose(backward=central)", TIE3, M2), ("zbv", TIE3 + INTERLEAVE, ()),
          ("dualpipev", TIE3 + INTERLEAVE, ())]
TIED_IDS = ["1f1b", "interleaved", "transpose", "transpose-central", "zbv", "dualpipev"]
EMBED = "model.language_model.embed_tokens.weight"
# ZeRO over data parallel (issue 37): P=1 x D=2 (without a pipeline MindFormers resets micro_batch_num to 1),
# MindFormers' AdamW with weight decay (its grouping: no decay for biases and 1-D weights), a cosine schedule
# over the 3 steps (total_steps given: the 2-step runs that save stay on the same curve) and MindFormers'
# default clipping at global norm 1.0
ZERO_ADAMW = ("parallel_config.pipeline_stage=1", "parallel_config.data_parallel=2", "train={seed: 0, steps: 3}",
              "optimizer={type: AdamW, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.1}",
              "lr_schedule={type: CosineWithWarmUpLR, learning_rate: 3.0e-3, lr_end: 1.0e-4, warmup_ratio: 0.0, "
              "total_steps: 3}")
M1 = ("parallel_config.micro_batch_num=1",)
# mixed precision (issue 37): float16 compute, float32 master weights, a dynamic loss scale that overflows at
# step 1 (2**18 on this model: the step is skipped on every rank, the scale halves), then two updates
FP16 = ("model.model_config.dtype=float16",
        "runner_wrapper={use_clip_grad: true, max_grad_norm: 1.0, scale_sense: {type: DynamicLossScaleUpdateCell, "
        "loss_scale_value: 262144, scale_factor: 2, scale_window: 2}}")
FP16_SCALES = [(262144.0, True), (131072.0, False), (131072.0, False)]   # (loss scale, overflow) of steps 1-3
FP16_GRAD_TOL = 1e-3   # last-step gradients, of each parameter's largest
FP16_RTOL = 1e-5   # measured: the pipeline's losses equal the float16 reference's bit for bit (0.0)
# activation recompute (issue 37.2), trained encoder. Interleaved V=2 cuts the 4 LLM layers into chunks of 1, so
# its layers=1 is its full (the same plan: checked in process, not launched again)
RECOMPUTE_25 = [("1f1b(recompute=full)", ()), ("1f1b(recompute=layers=1)", ()),
                ("interleaved(recompute=full)", INTERLEAVE), ("transpose(recompute=full)", ()),
                ("transpose(recompute=layers=1)", ())]
TIED_REF_STEPS = 4   # the tied checkpoint is resumed for a 4th step
# packed sequences (issue 38.3): several samples per sequence of 128 tokens (the demo's are 17 to 48), attention
# confined to each sample, M-RoPE per sample; the reference calls mindone's whole model on the same samples
# unpacked, with the same per-token loss normalisation
PACK = ("data.packing=true", "data.seq_len=128")
PACKED = [(Q25, "transpose", PACK), (Q3, "1f1b", PACK + UNEVEN)]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from hyperparallel.data.demo import write_demo
    paths = write_demo(str(tmp_path_factory.mktemp("qdemo")), 48, seed=3, video_files=True)
    return tuple(f"data.{k}={v}" for k, v in sorted(paths.items()))


def _overrides(demo, frozen, extra=(), micro=M2):
    return list(demo) + [f"train.steps={STEPS}", f"mpipe.encoder.trainable={'false' if frozen else 'true'}"] + \
        list(micro) + list(extra)


def _name(path, schedule, frozen, extra=()):
    stem = os.path.splitext(os.path.basename(path))[0]
    # the settings themselves name the case (two cases with as many settings must not share a dump folder)
    return case_name(f"{stem}_{schedule}_{'frozen' if frozen else 'trained'}_{'_'.join(extra)}")


def _case(tmp, demo, path, schedule, frozen, extra=(), micro=M2, **kw):
    return job_case(tmp, path, schedule, _name(path, schedule, frozen, extra),
                    _overrides(demo, frozen, extra, micro),
                    **dict(dict(steps=STEPS, path=path, frozen=frozen, extra=list(extra)), **kw), chunks="eager")


_REF = {}


def reference(demo, path, frozen, extra=(), micro=M2, steps=STEPS):
    key = (path, frozen, tuple(extra), tuple(micro), steps)
    if key not in _REF:
        _REF[key] = reference_run(load_recipe(path, _overrides(demo, frozen, extra, micro)), steps)
    return _REF[key]


def assert_matches(demo, case, micro=M2, steps=STEPS):
    extra = [e for e in case["extra"] if not any(k in e for k in ("pp_interleave_num", "pipeline_config", "offset",
                                                                  "mpipe.compile", "shape_buckets"))]
    grads = assert_equivalent(case, *reference(demo, case["path"], case["frozen"], extra, micro, steps))
    vision = [k for k in grads if k.startswith("model.visual.")]
    assert bool(vision) != case["frozen"], case["name"]
    tied = any("tie_word_embeddings=true" in e for e in extra)
    assert ("lm_head.weight" in grads) != tied and EMBED in grads   # tied: one parameter, the embedding's name
    return grads


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, demo):
    """A Hugging Face model directory (``save_pretrained``: the hub's names) of the tiny Qwen2.5-VL with
    other weights than the recipe's seed gives."""
    from hyperparallel.runtime import compat
    from hyperparallel.runconfig import load_parsed
    compat.setup_device("CPU")
    rc = load_parsed(Q25, _overrides(demo, False) + ["train.seed=123"]).run
    d = str(tmp_path_factory.mktemp("hf"))
    rc.model.network().save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def two_rank(tmp_path_factory, demo, hf_dir):
    from hyperparallel.runtime.ckpt_files import resolve
    tmp = str(tmp_path_factory.mktemp("qwen2"))
    cases = [_case(tmp, demo, Q25, s, fz, ex) for s, fz, ex in CASES_25]
    cases += [_case(tmp, demo, Q3, s, fz, ex) for s, fz, ex in CASES_3]
    cases += [_case(tmp, demo, p, s, fz, ex) for p, s, fz, ex in JIT_CASES]
    cases.append(_case(tmp, demo, Q25, "1f1b", False, (f"model.pretrained={hf_dir}",)))
    cases.append(_case(tmp, demo, Q25, "transpose", False, dump_dir=os.path.join(tmp, "dump", "from_hf"),
                       resume_from=resolve(hf_dir).to_json()))
    save = os.path.join(tmp, "ckpt")
    cases.append(_case(tmp, demo, Q25, "transpose", False, save_dir=save, save_every=2,
                       dump_dir=os.path.join(tmp, "dump", "saved")))
    tied_save = os.path.join(tmp, "ckpt_tied")
    for s, ex, micro in TIED_25:   # zbv saves steps 2 and 3 (rank 0 holds both copies: one value, one file)
        kw = dict(save_dir=tied_save, save_every=2) if s == "zbv" else {}
        if s in ("1f1b", "zbv"):   # metrics.jsonl: the grad norm (the tied weight counted once)
            kw["run_dir"] = os.path.join(tmp, "run", s)
        cases.append(_case(tmp, demo, Q25, s, False, ex, micro, **kw))
    cases += [_case(tmp, demo, Q3, s, False, ex, micro) for s, ex, micro in TIED_3]
    cases += [_case(tmp, demo, Q25, s, False, ex) for s, ex in RECOMPUTE_25]
    # resumed from zbv's step 3 under 1f1b (the copies re-tied on two ranks): the 4th step as the reference's
    cases.append(_case(tmp, demo, Q25, "1f1b", False, TIE, (), steps=TIED_REF_STEPS, save_dir=tied_save, resume=True,
                       dump_dir=os.path.join(tmp, "dump", "tied_resumed")))
    # ZeRO 1 and 2 (D=2, AdamW with weight decay); a ZeRO-2 checkpoint resumed unsharded, an unsharded one
    # resumed under ZeRO-1
    for level in (1, 2):
        cases.append(_case(tmp, demo, Q25, "1f1b", False, ZERO_ADAMW + (f"train.zero={level}",), M1,
                           dump_dir=os.path.join(tmp, "dump", f"zero{level}")))
    # tied embeddings under ZeRO-2 (one Parameter in the shares), saved: the tied copies' check reads the
    # gathered optimizer state
    cases.append(_case(tmp, demo, Q25, "1f1b", False, ZERO_ADAMW + TIE + ("train.zero=2",), M1,
                       save_dir=os.path.join(tmp, "ckpt_zero2_tied"), dump_dir=os.path.join(tmp, "dump", "zero2_tied")))
    zero_ckpt, d2_ckpt = os.path.join(tmp, "ckpt_zero2"), os.path.join(tmp, "ckpt_d2")
    cases.append(_case(tmp, demo, Q25, "1f1b", False, ZERO_ADAMW + ("train.zero=2",), M1, steps=2,
                       save_dir=zero_ckpt, save_every=1, dump_dir=os.path.join(tmp, "dump", "zero2_first")))
    cases.append(_case(tmp, demo, Q25, "1f1b", False, ZERO_ADAMW, M1, save_dir=zero_ckpt, resume=True,
                       dump_dir=os.path.join(tmp, "dump", "d2_resumed_from_zero2")))
    cases.append(_case(tmp, demo, Q25, "1f1b", False, ZERO_ADAMW, M1, steps=2, save_dir=d2_ckpt, save_every=1,
                       dump_dir=os.path.join(tmp, "dump", "d2_first")))
    cases.append(_case(tmp, demo, Q25, "1f1b", False, ZERO_ADAMW + ("train.zero=1",), M1, save_dir=d2_ckpt,
                       resume=True, dump_dir=os.path.join(tmp, "dump", "zero1_resumed_from_d2")))
    cases.append(_fp16_case(tmp, demo))
    cases += packed_cases(tmp, demo)
    launch_cases(tmp, cases, 2, timeout=1500)
    named = {os.path.basename(c["dump_dir"]): c for c in cases}
    return named, save


def packed_cases(tmp, demo):
    """The packed cases (:data:`PACKED`; the Qwen2.5-VL one writes metrics.jsonl: samples, real tokens), and a
    packed 1f1b run saving steps 1 and 2, resumed from step 2 for the third."""
    out = [_case(tmp, demo, path, s, False, ex, **({"run_dir": os.path.join(tmp, "run", "packed")} if path == Q25
                                                   else {})) for path, s, ex in PACKED]
    save = os.path.join(tmp, "ckpt_packed")
    out.append(_case(tmp, demo, Q25, "1f1b", False, PACK, steps=2, save_dir=save, save_every=1,
                     dump_dir=os.path.join(tmp, "dump", "packed_first")))
    out.append(_case(tmp, demo, Q25, "1f1b", False, PACK, save_dir=save, resume=True,
                     dump_dir=os.path.join(tmp, "dump", "packed_resumed")))
    return out


def _fp16_case(tmp, demo):
    """The float16 case: transpose (encoder activations cross ranks in float16), saved at its end."""
    return _case(tmp, demo, Q25, "transpose", False, FP16, save_dir=os.path.join(tmp, "ckpt_fp16"),
                 dump_dir=os.path.join(tmp, "dump", "fp16"), run_dir=os.path.join(tmp, "run", "fp16"))


@pytest.mark.msrun
@pytest.mark.parametrize("schedule,frozen,extra", CASES_25,
                         ids=[f"{s}-{'frozen' if f else 'trained'}{'-V2' if e else ''}" for s, f, e in CASES_25])
def test_qwen2_5_vl_two_ranks_match_mindones_model(two_rank, demo, schedule, frozen, extra):
    cases, _ = two_rank
    case = cases[_name(Q25, schedule, frozen, extra)]
    if extra:
        assert len([c for c in case["plan"]["chunks"] if c["region"] == "llm"]) == 4   # V = 2
    assert_matches(demo, case)


@pytest.mark.msrun
@pytest.mark.parametrize("path,schedule,frozen,extra", JIT_CASES, ids=JIT_IDS)
def test_compiled_chunks_train_like_mindones_model(two_rank, demo, path, schedule, frozen, extra):
    """``mpipe.compile: jit``: every chunk of both models ran compiled (vision and LLM, Qwen3-VL's deepstack features
    across both cuts, zb_h1's B computing the weight grads too) and trained like mindone's whole model (eager);
    an LLM chunk after the first compiled one graph; with ``data.shape_buckets: pow2`` the encoder's and the first
    LLM chunk's graphs are at most the buckets the micro-batches met, and the reference is the unpadded run."""
    cases, _ = two_rank
    case = cases[_name(path, schedule, frozen, extra)]
    assert case["raw"]["mpipe"]["compile"] == "jit"
    assert_matches(demo, case)
    stats = compile_stats(case)
    assert {s["chunk"].split("/")[0] for s in stats} == {"vision", "llm"}, stats
    assert all(s["mode"] == "jit" and s["compiles"] + s["reused"] >= 1 for s in stats), stats
    assert all(s["compiles"] + s["reused"] <= 2 * s["shapes"] for s in stats), stats   # on and off the tape at most
    if path == Q25:   # (Qwen3-VL's later LLM chunk here also receives deepstack features: their rows vary)
        assert all(s["shapes"] == 1 for s in stats if s["chunk"].startswith("llm/") and s["chunk"] != "llm/0"), stats
    if BUCKETS[0] in extra:   # fewer encoder input shapes than the same micro-batches unpadded (1f1b, jit)
        plain = compile_stats(cases[_name(Q25, "1f1b", False, JIT)])
        shapes = {s["chunk"]: s["shapes"] for s in stats}
        assert shapes["vision/0"] < {s["chunk"]: s["shapes"] for s in plain}["vision/0"], (stats, plain)


@pytest.mark.msrun
@pytest.mark.parametrize("level", [1, 2])
def test_qwen2_5_vl_zero_with_adamw_weight_decay_matches_mindones_model(two_rank, demo, level):
    """ZeRO over D=2 with MindFormers' AdamW and weight decay: the plan reduces (all-reduce, or at level 2 a
    reduce-scatter per region, each after the region's backward) and gathers over the data-parallel group;
    losses of 3 steps and every gradient equal the single-process reference's; every rank's measured grad,
    optimizer and peak grad bytes are the cost model's."""
    cases, _ = two_rank
    case = cases[f"zero{level}"]
    dp = [a["kind"] for a in case["plan"]["programs"]["0"] if a.get("group") == "dp"]
    assert dp == (["ALLREDUCE", "ALLGATHER"] if level == 1 else ["REDUCESCATTER", "REDUCESCATTER", "ALLGATHER"])
    assert case["raw"]["optimizer"]["weight_decay"] == 0.1 and case["plan"]["data_parallel"] == 2
    assert_matches(demo, case, micro=M1)
    assert_zero_memory(case, level, load_recipe(Q25, _overrides(demo, False, case["extra"], M1)))


def assert_zero_memory(case, level, recipe):
    """Every rank's measured bytes equal ``static_memory`` over the chunks' real parameter bytes and the run's
    weight-decay groups: parameters whole; grads (level 2) and optimizer state one share per region and group,
    ceil(N / D) float32 elements of its N (the padding included); a share is 1/D of the group and under one
    element more. The peak gradient bytes held during the step equal ``grad_peak``'s: at level 1 every
    whole gradient; at level 2 the LLM's whole gradients until its reduce-scatter right after its backward,
    then its share and the encoder's whole gradients, until the encoder's reduce-scatter."""
    from helpers import chunk_param_bytes, chunk_param_groups, measured_memory
    from hyperparallel.mpipe.cost import grad_peak, share_bytes, static_memory
    from hyperparallel.mpipe.ir import Plan
    plan = Plan.from_json(case["plan"])
    size, groups = chunk_param_bytes(case["raw"], plan), chunk_param_groups(case["raw"], plan)
    assert any(len(g) == 2 for g in groups.values())   # decay and no decay: two shares in a region
    factor = recipe.profile.optimizer_factor
    params, grads, optim = static_memory(plan, lambda r, c: size[(r, c)], factor, shard=share_bytes,
                                         groups=lambda r, c: groups[(r, c)])[0]
    ideal = static_memory(plan, lambda r, c: size[(r, c)], factor)[0]
    pad = 4 * 2 * len(plan.regions())
    assert params == ideal[0] and 0 <= optim - ideal[2] < pad * factor
    assert grads == ideal[1] == params if level == 1 else 0 <= grads - ideal[1] < pad
    peak = grad_peak(plan, lambda r, c: size[(r, c)], share_bytes, lambda r, c: groups[(r, c)])[0]
    dp = [(a.kind, a.region) for a in plan.programs[0] if a.group == "dp"]
    if level == 2:   # each region's reduce-scatter right after its last backward (1f1b, P = 1: LLM, then encoder)
        assert dp == [("REDUCESCATTER", "llm"), ("REDUCESCATTER", "vision"), ("ALLGATHER", None)]
        llm, vision = (sum(b for (r, _), b in size.items() if r == x) for x in ("llm", "vision"))
        assert peak == max(llm, grads - share_bytes_of(groups, "vision") + vision) < params
    else:
        assert peak == params
    got = measured_memory(case["dump_dir"])
    assert sorted(got) == [0, 1]
    for rank, steps in got.items():
        assert len(steps) == case["steps"]
        for m in steps:
            where = f"{case['name']} rank {rank} step {m['step']}: {m}"
            assert (m["params_bytes"], m["grads_bytes"], m["optimizer_bytes"]) == (params, grads, optim), where
            assert m["peak_grad_bytes"] == peak, where


def share_bytes_of(groups, region, D=2):
    """Bytes of one rank's share of ``region`` (its chunks' weight-decay groups: {(region, chunk): {wd: bytes}})."""
    from hyperparallel.mpipe.cost import share_bytes
    per = {}
    for (r, _), g in groups.items():
        for wd, b in g.items():
            if r == region:
                per[wd] = per.get(wd, 0) + b
    return sum(share_bytes(b, D) for b in per.values())


@pytest.mark.msrun
def test_qwen2_5_vl_zero_with_tied_embeddings_matches_and_saves(two_rank, demo):
    cases, _ = two_rank
    case = cases["zero2_tied"]
    grads = assert_matches(demo, case, micro=M1)
    assert "lm_head.weight" not in grads
    assert os.path.exists(os.path.join(case["save_dir"], f"step_{STEPS}", "COMPLETE"))


@pytest.mark.msrun
@pytest.mark.parametrize("saved,resumed", [("zero2_first", "d2_resumed_from_zero2"),
                                           ("d2_first", "zero1_resumed_from_d2")])
def test_zero_and_unsharded_checkpoints_resume_each_other(two_rank, demo, saved, resumed):
    """A ZeRO-2 run's checkpoint resumes unsharded, an unsharded one under ZeRO-1: the global names, full shapes
    (AdamW's moments of every parameter, no share names); the resumed step's loss is the reference's."""
    import safetensors.numpy as stn
    cases, _ = two_rank
    first, _ = dumped(cases[saved]["dump_dir"])
    rest, _ = dumped(cases[resumed]["dump_dir"])
    assert rest["start"] == 2 and len(rest["losses"]) == 1
    ref = reference(demo, Q25, False, [e for e in cases[saved]["extra"] if not e.startswith("train.zero")], M1)
    np.testing.assert_allclose(first["losses"] + rest["losses"], ref[0][:STEPS], rtol=1e-5)
    step = os.path.join(cases[saved]["save_dir"], "step_2")
    names = set()
    for fn in os.listdir(step):
        if fn.endswith(".safetensors"):
            names |= set(stn.load_file(os.path.join(step, fn)))
    assert f"adam_m.{EMBED}" in names and "global_step" in names and not any("shard." in n for n in names)


@pytest.mark.msrun
@pytest.mark.parametrize("schedule,extra", RECOMPUTE_25, ids=[s for s, _ in RECOMPUTE_25])
def test_qwen2_5_vl_recompute_trains_like_mindones_model_and_holds_what_the_cost_model_says(two_rank, demo, schedule,
                                                                                          extra):
    """Recompute full and layers=1 under 1f1b, interleaved and transpose: losses of 3 steps and the gradients
    equal mindone's whole model's; every rank's held forwards and held bytes (its boundary tensors, recomputed
    forwards' kept inputs included, images of other sizes every step) equal the cost model's."""
    from helpers import assert_memory_predicted
    cases, _ = two_rank
    case = cases[_name(Q25, schedule, False, extra)]
    assert any(c.get("recompute") for c in case["plan"]["chunks"])
    assert_matches(demo, case)
    assert_memory_predicted(case, load_recipe(Q25, _overrides(demo, False, extra)))
    if schedule.startswith("interleaved"):   # chunks of one layer: layers=1 is this plan
        from hyperparallel.mpipe.ir import Plan
        from hyperparallel.recipe import derive_recipe
        rec = load_recipe(Q25, _overrides(demo, False, extra))
        assert derive_recipe(rec, "interleaved(recompute=layers=1)").programs == Plan.from_json(case["plan"]).programs


@pytest.mark.msrun
@pytest.mark.parametrize("schedule,extra", [(s, e) for s, _, e in CASES_3],
                         ids=["transpose", "1f1b-uneven-deepstack-crossing"])
def test_qwen3_vl_two_ranks_match_mindones_model(two_rank, demo, schedule, extra):
    cases, _ = two_rank
    case = cases[_name(Q3, schedule, False, extra)]
    grads = assert_matches(demo, case)
    assert any(k.startswith("model.visual.deepstack_merger_list.") for k in grads)
    # these cases ask mpipe.compile: eager (the compiled ones: test_compiled_chunks_train_like_mindones_model), and
    # every rank's log record says so, per chunk
    stats = compile_stats(case)
    assert stats and all(s["asked"] == "eager" and s["mode"] == "eager" and s["compiles"] == 0 for s in stats), stats
    if extra:   # deepstack layer 1 is in the second LLM chunk: its feature crossed the boundary
        assert [c["stop"] - c["start"] for c in case["plan"]["chunks"] if c["region"] == "llm"] == [1, 3]


@pytest.mark.msrun
@pytest.mark.parametrize("schedule,extra,micro", TIED_25, ids=TIED_IDS)
def test_qwen2_5_vl_tied_embeddings_train_like_mindones_tied_model_in_every_order(two_rank, demo, schedule, extra,
                                                                                    micro):
    """tie_word_embeddings: the copies of the embedding (first LLM chunk) and LM head (last) are one weight:
    losses, grad norm and every rank's gradient of it equal the reference's (which has one Parameter)."""
    cases, _ = two_rank
    case = cases[_name(Q25, schedule, False, extra)]
    plan = case["plan"]
    assert plan["tied"] and plan["tied"][0]["devices"] == ([0] if schedule in ("zbv", "dualpipev") else [0, 1])
    # 4 micro-batches: the resumed case's 4-step reference (its first 3 steps compared)
    assert_matches(demo, case, micro, steps=TIED_REF_STEPS if not micro else STEPS)
    _, per_rank = dumped(case["dump_dir"])
    assert len(per_rank[EMBED]) == len(plan["tied"][0]["devices"])   # each holder: the whole (summed) gradient
    if case.get("run_dir"):   # step 1's global grad norm is the reference's (the tied weight counted once)
        with open(os.path.join(case["run_dir"], "metrics.jsonl")) as f:
            norm = json.loads(f.readline())["grad_norm"]
        ref = reference(demo, Q25, False, TIE, micro, TIED_REF_STEPS if not micro else STEPS)[1]
        np.testing.assert_allclose(norm, np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in ref.values())),
                                   rtol=1e-5)


@pytest.mark.msrun
@pytest.mark.parametrize("schedule,extra,micro", TIED_3, ids=TIED_IDS)
def test_qwen3_vl_tied_embeddings_train_like_mindones_tied_model_in_every_order(two_rank, demo, schedule, extra,
                                                                                  micro):
    """Qwen3-VL's text_config ties the embedding to the LM head: in every order the losses and every
    holder's gradient of the one weight equal mindone's tied model's."""
    cases, _ = two_rank
    case = cases[_name(Q3, schedule, False, extra)]
    assert case["plan"]["tied"][0]["devices"] == ([0] if schedule in ("zbv", "dualpipev") else [0, 1])
    assert_matches(demo, case, micro)
    _, per_rank = dumped(case["dump_dir"])
    assert len(per_rank[EMBED]) == len(case["plan"]["tied"][0]["devices"])


@pytest.mark.msrun
def test_tied_checkpoint_keeps_one_value_per_name_and_resumes_exactly_under_another_schedule(two_rank, demo):
    """zbv's checkpoint of the tied model: the embedding (and its moments) once, in rank 0's file; resumed
    under 1f1b (the copies on two ranks, both loaded from that one name) the 4th step's loss is the reference's."""
    from hyperparallel.runtime.ckpt_files import safetensors_header
    cases, _ = two_rank
    zbv = cases[_name(Q25, "zbv", False, TIE + INTERLEAVE)]
    step = os.path.join(zbv["save_dir"], "step_2")
    names = {f: set(safetensors_header(os.path.join(step, f))) for f in sorted(os.listdir(step))
             if f.endswith(".safetensors")}
    holders = [f for f, ns in names.items() if EMBED in ns]
    assert holders == ["rank_0.safetensors"], names.keys()
    assert {f"moment1.{EMBED}", f"moment2.{EMBED}"} <= names["rank_0.safetensors"]
    assert not any("lm_head" in n for ns in names.values() for n in ns)
    got, _ = dumped(cases["tied_resumed"]["dump_dir"])
    assert got["start"] == 3 and len(got["losses"]) == 1
    ref = reference(demo, Q25, False, TIE, micro=(), steps=TIED_REF_STEPS)
    np.testing.assert_allclose(got["losses"][0], ref[0][3], rtol=1e-5)


@pytest.mark.msrun
def test_tied_checkpoint_exports_hugging_faces_tied_form(two_rank, tmp_path):
    """``ckpt --export-hf`` of the tied checkpoint: no ``lm_head.weight`` (Hugging Face's tied form), the config
    says tied, and ``from_pretrained`` ties the head to the exported embedding."""
    import subprocess
    import sys
    cases, _ = two_rank
    step = os.path.join(cases[_name(Q25, "zbv", False, TIE + INTERLEAVE)]["save_dir"], "step_2")
    out = tmp_path / "hf_tied"
    p = subprocess.run([sys.executable, "-m", "hyperparallel", "ckpt", step, "--export-hf", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    from hyperparallel.runtime.ckpt_files import safetensors_header
    names = set(safetensors_header(str(out / "model.safetensors")))
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    with open(out / "config.json") as f:
        assert json.load(f)["text_config"]["tie_word_embeddings"] is True
    from hyperparallel.runtime import compat
    from hyperparallel.models.qwen_vl import cpu as mindone_cpu
    compat.setup_device("CPU")
    mindone_cpu.apply()
    import mindspore as ms
    from mindone.transformers import Qwen2_5_VLForConditionalGeneration
    net = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(out))
    saved = ms.load_checkpoint(os.path.join(step, "rank_0.safetensors"), format="safetensors")[EMBED].asnumpy()
    np.testing.assert_array_equal(net.lm_head.weight.asnumpy(), saved)


@pytest.mark.msrun
def test_runs_start_from_a_hugging_face_directory_by_name_in_any_cut(two_rank, demo, hf_dir):
    """``model.pretrained: DIR`` (1f1b) and ``--resume-from DIR`` (transpose) load the hub-named weights by
    name into each rank's chunks: both start like mindone's model built from the same directory (step 0's
    loss and gradients) and train alike (3 steps)."""
    cases, _ = two_rank
    pre = cases[_name(Q25, "1f1b", False, (f"model.pretrained={hf_dir}",))]
    ref = reference(demo, Q25, False, (f"model.pretrained={hf_dir}",))
    assert_equivalent(pre, *ref)   # every step, and the last step's gradients, against the reference
    assert_equivalent(cases["from_hf"], *ref)
    np.testing.assert_allclose(dumped(pre["dump_dir"])[0]["losses"], dumped(cases["from_hf"]["dump_dir"])[0]["losses"],
                               rtol=1e-5)
    assert not np.allclose(ref[0][0], reference(demo, Q25, False)[0][0])   # other weights than the seed's


@pytest.mark.msrun
@pytest.mark.parametrize("path,schedule,extra", PACKED, ids=["qwen2_5_vl-transpose", "qwen3_vl-1f1b-uneven"])
def test_packed_sequences_train_like_mindones_model_on_the_samples_unpacked(two_rank, demo, path, schedule, extra):
    """data.packing: losses of 3 steps and step-0 / last-step gradients equal the reference, mindone's whole
    model called on the same samples one per row; the steps held more samples than sequences, and
    metrics.jsonl says how many and their real tokens."""
    cases, _ = two_rank
    assert_matches(demo, cases[_name(path, schedule, False, extra)])
    if path != Q25:
        return
    from hyperparallel.runconfig import load_parsed
    src = load_parsed(Q25, _overrides(demo, False, extra)).run.source()
    rows = [json.loads(ln) for ln in open(os.path.join(cases[_name(path, schedule, False, extra)]["run_dir"],
                                                       "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for step, r in enumerate(rows):
        want = src.step_counts(step)
        assert (r["samples"], r["real_tokens"]) == (want["samples"], want["real_tokens"])
        assert r["samples"] > 2 * 2   # 2 micro-batches of 2 sequences
        assert r["real_tokens_per_s"] == pytest.approx(r["real_tokens"] / r["step_time_s"], rel=1e-6)
    src.close()


@pytest.mark.msrun
def test_packed_run_resumes_at_the_next_packed_sequences(two_rank, demo):
    """A packed checkpoint's data position counts packed sequences (``packed: true``); resumed from step 2, the
    third step's loss is the reference's third (the same samples as an uninterrupted run)."""
    cases, _ = two_rank
    first, _ = dumped(cases["packed_first"]["dump_dir"])
    rest, _ = dumped(cases["packed_resumed"]["dump_dir"])
    assert first["start"] == 0 and rest["start"] == 2 and len(rest["losses"]) == 1
    ref = reference(demo, Q25, False, list(PACK))
    np.testing.assert_allclose(first["losses"] + rest["losses"], ref[0][:STEPS], rtol=1e-5)
    with open(os.path.join(cases["packed_first"]["save_dir"], "step_2", "meta.json")) as f:
        pos = json.load(f)["data_position"]
    assert pos["packed"] is True and pos["next_step"] == 2 and pos["index"] > 0


@pytest.mark.msrun
@pytest.mark.parametrize("path", [Q25, Q3], ids=["qwen2_5_vl", "qwen3_vl"])
def test_micro_batches_hold_images_of_different_sizes_text_only_samples_and_videos(two_rank, demo, path):
    """The cases above trained on what Qwen's processor makes of the demo set: checked on its index. Every
    sample is used (the recipes refuse bad ones); the steps trained hold a frame-list video beside an image,
    a video file alone, and micro-batches without videos."""
    from hyperparallel.runconfig import load_parsed
    rc = load_parsed(path, _overrides(demo, False)).run
    src = rc.source()
    assert src.skipped == 0 and rc.data.on_bad_sample == "error"
    sizes, text_only, per_micro, videos = set(), 0, [], []
    for step in range(STEPS):
        for m in range(2):
            mb = src.micro_batch(step, m)
            grid = np.asarray(mb.image_grid_thw)[:len(mb.image_grid_thw) - mb.extra_images]
            sizes |= {tuple(g) for g in grid}
            text_only += sum(1 for n, v in zip(mb.images_per_sample, mb.videos_per_sample) if n == v == 0)
            per_micro.append(mb.num_image_tokens)
            kinds = [isinstance(v.source, str) for s in src.batch_samples(step, m) for v in s.enc.videos]
            videos.append((kinds, len(grid)))
            assert int((mb.input_ids == rc.model.cfg.video_token_id).sum()) == mb.num_video_tokens
    src.close()
    assert len(sizes) >= 3 and text_only >= 1 and len(set(per_micro)) >= 3, (sizes, text_only, per_micro)
    assert ([False], 1) in videos and ([True], 0) in videos and any(not k for k, _ in videos), videos


@pytest.mark.msrun
def test_hugging_face_export_loads_with_from_pretrained_and_gives_the_pipelines_loss(two_rank, demo, tmp_path):
    """Step 2 of a transpose run, exported by ``hyperparallel ckpt --export-hf``: mindone's
    ``from_pretrained`` loads it, and its loss on step 2's micro-batches is the loss the pipeline
    computed at step 2 (with the same weights)."""
    import subprocess
    import sys
    cases, save = two_rank
    out = tmp_path / "hf"
    p = subprocess.run([sys.executable, "-m", "hyperparallel", "ckpt", os.path.join(save, "step_2"), "--export-hf",
                        str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    from hyperparallel.runtime.ckpt_files import safetensors_header
    names = set(safetensors_header(str(out / "model.safetensors")))
    assert "lm_head.weight" in names and any(n.startswith("visual.") for n in names)   # the hub's spelling
    from hyperparallel.runtime import compat
    from hyperparallel.models.qwen_vl import cpu as mindone_cpu
    from hyperparallel.runconfig import load_parsed
    compat.setup_device("CPU")
    mindone_cpu.apply()
    from mindone.transformers import Qwen2_5_VLForConditionalGeneration
    net = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(out))
    rc = load_parsed(Q25, _overrides(demo, False)).run
    from hyperparallel.models.qwen_vl.cells import WholeModel
    whole = WholeModel(rc.model)
    whole.net = net
    src = rc.source()
    from hyperparallel.data.loss_norm import loss_scales
    scales = loss_scales(src, 2, 2, rc.train.loss_normalization)   # each micro-batch's share of the step's tokens
    loss = sum(float(whole.loss(src.micro_batch(2, m), scales[m]).asnumpy()) for m in range(2))
    src.close()
    got, _ = dumped(cases["saved"]["dump_dir"])
    np.testing.assert_allclose(loss, got["losses"][2], rtol=1e-5)


@pytest.fixture(scope="module")
def four_rank(tmp_path_factory, demo, two_rank):
    """One launch on 4 ranks: transpose P=4; tied, D=2 x P=2 (1f1b); tied, P=4 (1f1b) resumed from the
    2-rank zbv checkpoint (one holder, rank 0) at its step 3."""
    from hyperparallel.runtime.ckpt_files import resolve
    tmp = str(tmp_path_factory.mktemp("qwen4"))
    named, _ = two_rank
    zbv = named[_name(Q25, "zbv", False, TIE + INTERLEAVE)]
    cases = {"p4": _case(tmp, demo, Q25, "transpose", False, P4, micro=()),
             "tied_d2": _case(tmp, demo, Q25, "1f1b", False, TIE + D2),
             "tied_p4_resumed": _case(tmp, demo, Q25, "1f1b", False, TIE + P4, (), steps=TIED_REF_STEPS,
                                      resume_from=resolve(os.path.join(zbv["save_dir"], "step_3")).to_json(),
                                      dump_dir=os.path.join(tmp, "dump", "tied_p4_resumed"))}
    launch_cases(tmp, list(cases.values()), 4, timeout=1200)
    return cases


@pytest.mark.msrun
def test_qwen2_5_vl_four_ranks_transpose_matches(four_rank, demo):
    case = four_rank["p4"]
    assert case["plan"]["num_devices"] == 4 and case["plan"]["num_micro"] == 4
    assert_equivalent(case, *reference(demo, Q25, False, micro=()))


@pytest.mark.msrun
def test_qwen2_5_vl_tied_embeddings_with_data_parallel_match(four_rank, demo):
    """D=2 x P=2, tied: each data-parallel replica sums its two copies (ranks 0+2, 1+3), then the data-parallel
    all-reduce sums the replicas; losses and all 4 ranks' gradients of the one weight equal the reference's."""
    case = four_rank["tied_d2"]
    assert case["plan"]["data_parallel"] == 2 and case["plan"]["tied"][0]["devices"] == [0, 1]
    assert_matches(demo, case)
    _, per_rank = dumped(case["dump_dir"])
    assert len(per_rank[EMBED]) == 4


@pytest.mark.msrun
def test_tied_checkpoint_resumes_exactly_under_another_pipeline_size(four_rank, demo):
    """zbv's P=2 checkpoint (the embedding once, from rank 0) resumed by 1f1b with P=4: the copies on the
    first and last device both load that one value (and its moments); the 4th step's loss is the reference's."""
    case = four_rank["tied_p4_resumed"]
    assert case["plan"]["num_devices"] == 4 and case["plan"]["tied"][0]["devices"] == [0, 3]
    got, per_rank = dumped(case["dump_dir"])
    assert got["start"] == 3 and len(got["losses"]) == 1
    ref = reference(demo, Q25, False, TIE, micro=(), steps=TIED_REF_STEPS)
    np.testing.assert_allclose(got["losses"][0], ref[0][3], rtol=1e-5)
    want = ref[2][3][EMBED]   # both copies' gradient of the resumed step: the reference's 4th step's
    assert len(per_rank[EMBED]) == 2
    for g in per_rank[EMBED]:
        np.testing.assert_allclose(g, want, rtol=LAST_STEP_TOL, atol=LAST_STEP_TOL * float(np.abs(want).max()))


def _fp16_reference(demo):
    """The single-process float16 reference (the same casts and scaler): (losses, (scale, overflow) per step,
    last step's gradients)."""
    from hyperparallel.runtime import compat
    from hyperparallel.runconfig import load_parsed
    from hyperparallel.runtime.reference import Reference
    compat.setup_device("CPU")
    recipe = load_parsed(Q25, _overrides(demo, False, FP16))
    ref = Reference(recipe.run, recipe.micro_batch_num,
                    {r.name: True for r in recipe.profile.regions})
    losses, scales, grads = [], [], None
    for s in range(STEPS):
        loss, grads = ref.step(s)
        losses.append(loss)
        scales.append((ref.loss_scale, ref.overflow))
    return losses, scales, grads


@pytest.mark.msrun
def test_float16_with_dynamic_loss_scaling_trains_like_the_float16_reference(two_rank, demo):
    """float16 compute with a dynamic loss scale on 2 ranks: 3 losses within FP16_RTOL of the single-process
    float16 reference, the same overflow verdict (step 1 skipped on every rank, the scale halved; the metrics
    line says so), the last step's gradients of every parameter within LAST_STEP_TOL, and the master weights
    and gradients float32."""
    case = two_rank[0]["fp16"]
    losses, scales, ref_grads = _fp16_reference(demo)
    got, _ = dumped(case["dump_dir"])
    np.testing.assert_allclose(got["losses"], losses, rtol=FP16_RTOL)
    assert scales == FP16_SCALES
    with open(os.path.join(case["run_dir"], "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    assert [(r["loss_scale"], r["overflow"], r["skipped"]) for r in recs] == [(s, o, o) for s, o in FP16_SCALES]
    assert recs[0]["grad_norm"] is None and recs[-1]["steps_skipped"] == 1
    _, last = dumped(case["dump_dir"], grads_of="last")
    assert {g.dtype for per_rank in last.values() for g in per_rank} == {np.dtype(np.float32)}
    worst = max(float(np.abs(g - ref_grads[n]).max()) / float(np.abs(ref_grads[n]).max())
                for n, per_rank in last.items() for g in per_rank)
    print("fp16: worst last-step grad error (of the parameter's largest):", worst, "worst loss error (relative):",
          max(abs(a - b) / abs(b) for a, b in zip(got["losses"], losses)))
    _assert_grads(case["name"], last, ref_grads, "step-3 (float16)", FP16_GRAD_TOL)
    # memory: float32 master weights (4 bytes an element, no float16 copy kept), float32 gradients, Adam's two
    # float32 moments; the cost model's static bytes and held forwards
    recipe = load_recipe(Q25, _overrides(demo, False, FP16))
    assert_memory_predicted(case, recipe)
    elements = {n: int(np.prod(g[0].shape)) for n, g in last.items()}
    for rank, steps in measured_memory(case["dump_dir"]).items():
        assert steps[0]["grads_bytes"] == steps[0]["params_bytes"] == steps[0]["optimizer_bytes"] // 2, rank
    assert sum(m[0]["params_bytes"] for m in measured_memory(case["dump_dir"]).values()) == \
        4 * sum(elements[n] * len(last[n]) for n in last)   # every copy a rank holds (an element once per holder)
    # activations: the float32 twin (same schedule, data, micro-batches) holds the same forwards, and every
    # boundary tensor but the model input (pixels, float32) and the loss (float32) is float16 here: the measured
    # peak held bytes are exactly the cost model's over the twin's boundary tensors with those at 2 bytes an
    # element instead of 4, and below the twin's measured peak
    assert_float16_activations(case, two_rank[0][_name(Q25, "transpose", False)], recipe)


def assert_float16_activations(case, twin, recipe):
    from hyperparallel.mpipe.cost import activation_events, peak_of, simulate
    from hyperparallel.mpipe.ir import Plan
    from helpers import boundary_bytes
    plan = Plan.from_json(case["plan"])
    assert Plan.from_json(twin["plan"]).programs == plan.programs
    ex = simulate(plan, recipe.profile).execution
    first, last = (plan.regions()[0], 0), (plan.regions()[-1], max(c.index for c in plan.chunks
                                                                    if c.region == plan.regions()[-1]))
    got, got32 = measured_memory(case["dump_dir"]), measured_memory(twin["dump_dir"])
    for rank, steps in got.items():
        d = rank // plan.data_parallel
        for m, m32 in zip(steps, got32[rank]):
            held32, kept32 = boundary_bytes(twin["raw"], plan, m["dp_index"], m["step"] - 1)

            def half(nbytes, whole):   # a float16 tensor of the float32 one's elements (or float32 as it was)
                return nbytes if whole else nbytes // 2

            def kept(k):
                return half(kept32(k), k[1:3] == first)

            def held(k):
                return kept(k) + half(held32(k) - kept32(k), k[1:3] == last)

            want = peak_of(activation_events(plan, ex, d, held, kept, lambda k: 0))
            assert m["peak_held_bytes"] == want < m32["peak_held_bytes"], (rank, m, m32, want)


@pytest.mark.msrun
def test_float16_checkpoint_keeps_float32_master_weights_and_loads_into_a_float32_run(two_rank, demo):
    """The float16 run's checkpoint holds float32 weights and optimizer state under the model's names (what a
    float32 run holds), records the loss scale, and a float32 model restores it exactly."""
    from safetensors import safe_open
    from hyperparallel.runtime import compat
    from hyperparallel.runtime.ckpt_files import resolve
    from hyperparallel.runconfig import load_parsed
    from hyperparallel.runtime.reference import Reference
    case = two_rank[0]["fp16"]
    src = resolve(os.path.join(case["save_dir"], f"step_{STEPS}"))
    assert src.meta["loss_scale"] == {"loss_scale": 262144.0, "loss_scale_counter": 0}   # 2 finite steps: doubled
    values = {}
    for f in src.files:
        with safe_open(f, "np") as st:
            values.update({k: st.get_tensor(k) for k in st.keys()})
    floats = {k: v.dtype for k, v in values.items() if v.dtype.kind == "f"}
    assert floats and set(floats.values()) == {np.dtype(np.float32)}
    compat.setup_device("CPU")
    recipe = load_parsed(Q25, _overrides(demo, False))   # float32, no loss scale
    ref = Reference(recipe.run, recipe.micro_batch_num,
                    {r.name: True for r in recipe.profile.regions})
    step, with_state = ref.restore(src)
    assert (step, with_state) == (STEPS, True)
    params = {p.name: p for p in ref.all_params()}
    assert set(params) <= set(values)
    for name, p in params.items():
        assert str(p.dtype) == "Float32" and np.array_equal(p.asnumpy(), values[name]), name
    # a float16 run resuming it continues with the saved loss scale, not the recipe's initial one
    fp16 = load_parsed(Q25, _overrides(demo, False, FP16))
    again = Reference(fp16.run, fp16.micro_batch_num, {r.name: True for r in fp16.profile.regions})
    again.scaler.update(False)   # (moved off the recipe's 262144 first, so the restore must set it)
    again.restore(src)
    assert again.scaler.state() == src.meta["loss_scale"]
