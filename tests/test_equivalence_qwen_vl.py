"""mindone's Qwen2.5-VL and Qwen3-VL pipelined on 2 and 4 msrun ranks train exactly like mindone's whole
model called as users call it (``model(input_ids=..., attention_mask=..., pixel_values=...,
image_grid_thw=..., labels=...)``), on the demo conversations laid out as Qwen's processor lays them
out: images of different sizes inside and across micro-batches, text-only samples, video samples
left out. Losses of 3 optimizer steps within 1e-5 relative, every step-0 gradient within 1e-5.

Launches: one on 2 ranks (Qwen2.5-VL: 1f1b, interleaved V=2, zb_h1, transpose owner and central,
encoder frozen and trained; activation recompute, full and layers=1; Qwen3-VL: transpose, and 1f1b with an
uneven cut that carries a deepstack feature across the LLM boundary; a run started from a Hugging Face
directory; a run that saves, exported to Hugging Face format afterwards; tied word embeddings: both models in
every order, a zbv checkpoint resumed under 1f1b), one on 4 ranks (transpose P=4; tied: D=2 x P=2, and the
2-rank zbv checkpoint resumed with P=4).
"""
import json
import os

import numpy as np
import pytest

pytest.importorskip("mindspore", reason="mindspore is not installed")
pytest.importorskip("mindone", reason="mindone is not installed")

from helpers import (LAST_STEP_TOL, assert_equivalent, case_name, dumped, job_case, launch_cases,  # noqa: E402
                     reference_run)
from hyperparallel.recipe import load_recipe  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
Q25 = os.path.join(HERE, "..", "recipes", "qwen2_5_vl_tiny.yaml")
Q3 = os.path.join(HERE, "..", "recipes", "qwen3_vl_tiny.yaml")
STEPS = 3
M2 = ("parallel_config.micro_batch_num=2",)   # 2 ranks: 2 micro-batches of 2 samples (fast); 4 ranks: the recipe's 4
INTERLEAVE = ("parallel.pipeline_config={pipeline_interleave: true, pipeline_scheduler: 1f1b}",
              "model.model_config.pp_interleave_num=2")
CASES_25 = [("1f1b", False, ()), ("1f1b", True, ()), ("interleaved", False, INTERLEAVE), ("zb_h1", False, ()),
            ("transpose", False, ()), ("transpose", True, ()), ("transpose(backward=central)", False, ()),
            ("transpose(backward=central)", True, ())]
UNEVEN = ("model.model_config.offset=[-1, 1]",)   # MindFormers' offset: LLM layers 1 + 3 on the two stages
CASES_3 = [("transpose", False, ()), ("1f1b", False, UNEVEN)]
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
# activation recompute (issue 37.2), trained encoder. Interleaved V=2 cuts the 4 LLM layers into chunks of 1, so
# its layers=1 is its full (the same plan: checked in process, not launched again)
RECOMPUTE_25 = [("1f1b(recompute=full)", ()), ("1f1b(recompute=layers=1)", ()),
                ("interleaved(recompute=full)", INTERLEAVE), ("transpose(recompute=full)", ()),
                ("transpose(recompute=layers=1)", ())]
TIED_REF_STEPS = 4   # the tied checkpoint is resumed for a 4th step


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from hyperparallel.data.demo import write_demo
    paths = write_demo(str(tmp_path_factory.mktemp("qdemo")), 48, seed=3)
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
                    **dict(dict(steps=STEPS, path=path, frozen=frozen, extra=list(extra)), **kw), chunks="jit")


_REF = {}


def reference(demo, path, frozen, extra=(), micro=M2, steps=STEPS):
    key = (path, frozen, tuple(extra), tuple(micro), steps)
    if key not in _REF:
        _REF[key] = reference_run(load_recipe(path, _overrides(demo, frozen, extra, micro)), steps)
    return _REF[key]


def assert_matches(demo, case, micro=M2, steps=STEPS):
    extra = [e for e in case["extra"] if not any(k in e for k in ("pp_interleave_num", "pipeline_config", "offset"))]
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
    from hyperparallel.runconfig import run_config_of
    compat.setup_device("CPU")
    rc = run_config_of(load_recipe(Q25, _overrides(demo, False) + ["train.seed=123"]))
    d = str(tmp_path_factory.mktemp("hf"))
    rc.model.network().save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def two_rank(tmp_path_factory, demo, hf_dir):
    from hyperparallel.runtime.ckpt_files import resolve
    tmp = str(tmp_path_factory.mktemp("qwen2"))
    cases = [_case(tmp, demo, Q25, s, fz, ex) for s, fz, ex in CASES_25]
    cases += [_case(tmp, demo, Q3, s, fz, ex) for s, fz, ex in CASES_3]
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
    launch_cases(tmp, cases, 2, timeout=1500)
    named = {os.path.basename(c["dump_dir"]): c for c in cases}
    return named, save


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
    # mpipe.compile: jit (the default): mindone's chunks have no tensor-only body yet, so they run eager
    # and every rank's log record says so, per chunk
    for rank in (0, 1):
        with open(os.path.join(case["dump_dir"], f"compile_rank{rank}.json")) as f:
            stats = json.load(f)
        assert stats and all(s["asked"] == "jit" and s["mode"] == "eager" and "no tensor-only body" in s["reason"]
                             for s in stats), stats
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
    from hyperparallel.models import mindone_cpu
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
def test_micro_batches_hold_images_of_different_sizes_and_text_only_samples(two_rank, demo):
    """The cases above trained on what Qwen's processor makes of the demo set: checked on its index."""
    from hyperparallel.runconfig import run_config_of
    rc = run_config_of(load_recipe(Q25, _overrides(demo, False)))
    src = rc.source()
    sizes, text_only, per_micro = set(), 0, []
    for step in range(STEPS):
        for m in range(2):
            mb = src.micro_batch(step, m)
            grid = np.asarray(mb.image_grid_thw)[:len(mb.image_grid_thw) - mb.extra_images]
            sizes |= {tuple(g) for g in grid}
            text_only += sum(1 for n in mb.images_per_sample if n == 0)
            per_micro.append(mb.num_image_tokens)
    src.close()
    assert len(sizes) >= 3 and text_only >= 1 and len(set(per_micro)) >= 3, (sizes, text_only, per_micro)


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
    from hyperparallel.models import mindone_cpu
    from hyperparallel.runconfig import run_config_of
    compat.setup_device("CPU")
    mindone_cpu.apply()
    from mindone.transformers import Qwen2_5_VLForConditionalGeneration
    net = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(out))
    rc = run_config_of(load_recipe(Q25, _overrides(demo, False)))
    from hyperparallel.models.qwen_vl_cells import WholeModel
    whole = WholeModel(rc.model)
    whole.net = net
    src = rc.source()
    loss = sum(float(whole.loss(src.micro_batch(2, m), 0.5).asnumpy()) for m in range(2))
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
