"""MindFormers' own LlamaForCausalLM (+ the project's ViT) pipelined on 2 and 4 msrun ranks trains
exactly like the single-process reference (the same MindFormers model without a pipeline).

One msrun launch for every 2-rank case (gpipe, 1f1b, interleaved V=2, zb_h1, transpose with
owner and central backward, encoder frozen and trained, plus the Qwen2-shaped variant), one
for the 4-rank cases; per case the losses of 3 optimizer steps and every step-0 gradient are
compared with ``mindspore.value_and_grad`` over the whole model in this process.
MindFormers' logs go to a temporary folder (``LOCAL_DEFAULT_PATH``), never into the repository.
"""
import importlib.util
import os
import tempfile

import numpy as np
import pytest

pytest.importorskip("mindspore", reason="mindspore is not installed")

if importlib.util.find_spec("mindformers") is None:
    pytest.skip("mindformers is not installed", allow_module_level=True)
# before anything imports mindformers (its logger reads this at import time); the msrun
# workers inherit it
os.environ.setdefault("LOCAL_DEFAULT_PATH", tempfile.mkdtemp(prefix="hp_mindformers_logs_"))

from helpers import assert_equivalent, case_name, compile_stats, dumped, job_case, launch_cases, reference_run  # noqa: E402
from hyperparallel.recipe import load_recipe  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA = os.path.join(HERE, "..", "..", "recipes", "mf_llama_mllm.yaml")
QWEN2 = os.path.join(HERE, "..", "..", "recipes", "mf_qwen2_mllm.yaml")
DATA = os.path.join(HERE, "..", "..", "recipes", "mf_llama_mllm_data.yaml")   # LLaVA-style conversations
STEPS = 3
DATA_STEPS = 12   # the conversation-data case runs longer: its loss must fall (first 3 vs the reference)
SCHEDULES_2 = ["gpipe", "1f1b", "interleaved", "zb_h1", "transpose", "transpose(backward=central)"]
FROZEN_2 = ["1f1b", "transpose", "transpose(backward=central)"]   # a frozen encoder: its placements
LLAMA_CASES_2 = [(s, False) for s in SCHEDULES_2] + [(s, True) for s in FROZEN_2]
QWEN2_CASES_2 = [("transpose(backward=central)", False), ("1f1b", True)]
P4 = ("parallel_config.pipeline_stage=4",)
EAGER = ("mpipe.compile=eager",)
BUCKETS = ("data.shape_buckets=pow2",)
# tied word embeddings (issue 40): MindFormers' LM head is its embedding table; every order equals the
# reference (V-shape orders: rank 0 holds both ends, one Parameter)
TIE = ("model.model_config.tie_word_embeddings=true",)
V2 = ("parallel_config.pp_interleave_num=2",
      "parallel.pipeline_config={pipeline_interleave: true, pipeline_scheduler: 1f1b}")
TIED_CASES = [("1f1b", TIE), ("interleaved", TIE + V2), ("zbv", TIE + V2), ("dualpipev", TIE + V2),
              ("transpose", TIE), ("transpose(backward=central)", TIE)]
EMBED = "model.tok_embeddings.embedding_weight"


def _overrides(schedule: str, frozen: bool, extra=()):
    ov = [f"mpipe.profile.regions.0.trainable={'false' if frozen else 'true'}", f"train.steps={STEPS}"]
    if schedule == "interleaved":
        ov.append("parallel_config.pp_interleave_num=2")
    return ov + list(extra)


def _name(path, schedule, frozen, extra=()):
    stem = os.path.splitext(os.path.basename(path))[0]
    return case_name(f"{stem}_{schedule}_{'frozen' if frozen else 'trained'}_{'_'.join(extra)}")


def _case(tmp, path, schedule, frozen, extra=(), steps=STEPS):
    return job_case(tmp, path, schedule, _name(path, schedule, frozen, extra), _overrides(schedule, frozen, extra),
                    steps=steps, path=path, frozen=frozen, extra=list(extra), chunks="jit")


def _run(tmp, cases, world):
    launch_cases(tmp, cases, world, timeout=1800)   # compiled chunks: compiles add ~10-30 s per case


def _dumped(case):
    got, grads = dumped(case["dump_dir"])
    return got["losses"], grads


_REF = {}


def reference(path, frozen, extra=(), steps=STEPS):
    """Per-step losses, first- and last-step grads of the single-process reference (same MindFormers
    model), ``steps`` steps."""
    key = (path, frozen, tuple(extra), steps)
    if key not in _REF:
        _REF[key] = reference_run(load_recipe(path, overrides=_overrides("1f1b", frozen, extra)), steps)
    return _REF[key]


def assert_matches_reference(case):
    grads = assert_equivalent(case, *reference(case["path"], case["frozen"], [e for e in case["extra"] if e not in V2],
                                               case["steps"]))
    # MindFormers' own parameter names, every decoder layer and the head (tied: the embedding's one name)
    assert ("lm_head.weight" in grads) != (TIE[0] in case["extra"]) and EMBED in grads
    assert "model.layers.3.attention.wq.weight" in grads
    assert any(k.startswith("vision.") for k in grads) != case["frozen"]


def demo_data(tmp):
    """The demo conversations (as tools/make_demo_data.py writes them) in ``tmp``, as recipe overrides."""
    from hyperparallel.data.demo import write_demo
    paths = write_demo(os.path.join(tmp, "demo"))
    return tuple(f"data.{k}={v}" for k, v in sorted(paths.items()))


@pytest.fixture(scope="module")
def two_rank(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("mf2"))
    cases = [_case(tmp, LLAMA, s, fz) for s, fz in LLAMA_CASES_2]
    cases += [_case(tmp, QWEN2, s, fz) for s, fz in QWEN2_CASES_2]
    # compiled, with shape buckets: conversations give a new input shape almost every micro-batch, and
    # data.shape_buckets: pow2 bounds the graphs (compared with the reference on the unpadded data)
    cases.append(_case(tmp, DATA, "transpose", False, demo_data(tmp) + BUCKETS, steps=DATA_STEPS))
    cases.append(_case(tmp, LLAMA, "zb_h1", False, EAGER))   # the eager path stays tested (the rest compile)
    cases += [_case(tmp, LLAMA, s, False, ex) for s, ex in TIED_CASES]
    _run(tmp, cases, 2)
    return {c["name"]: c for c in cases}


@pytest.mark.msrun
def test_llama_eager_chunks_match_reference(two_rank):
    case = two_rank[_name(LLAMA, "zb_h1", False, EAGER)]
    assert_matches_reference(case)
    assert all(s["mode"] == "eager" and s["compiles"] == 0 for s in compile_stats(case))


@pytest.mark.msrun
@pytest.mark.parametrize("schedule", ["1f1b", "zb_h1", "transpose"])
def test_llama_chunks_ran_compiled(two_rank, schedule):
    """MindFormers' decoder layers compile: every chunk ran jit, an LLM chunk after the first once."""
    stats = compile_stats(two_rank[_name(LLAMA, schedule, False)])
    assert stats and all(s["mode"] == "jit" for s in stats), stats
    # one graph (compiled in this case or by an earlier case of the launch, GraphPool)
    assert all(s["compiles"] + s["reused"] == 1 for s in stats if s["chunk"].startswith("llm/") and s["chunk"] != "llm/0")


@pytest.mark.msrun
@pytest.mark.parametrize("schedule,frozen", LLAMA_CASES_2,
                         ids=[f"{s}-{'frozen' if f else 'trained'}" for s, f in LLAMA_CASES_2])
def test_llama_two_ranks_match_reference(two_rank, schedule, frozen):
    assert_matches_reference(two_rank[_name(LLAMA, schedule, frozen)])


@pytest.mark.msrun
@pytest.mark.parametrize("schedule,extra", TIED_CASES, ids=[s for s, _ in TIED_CASES])
def test_llama_tied_embeddings_match_reference_in_every_order(two_rank, schedule, extra):
    """``tie_word_embeddings: true``: the embedding (first LLM chunk) and LM head (last) are one weight in every
    order: losses and every rank's gradient of it equal the single-process model's (one Parameter)."""
    case = two_rank[_name(LLAMA, schedule, False, extra)]
    assert case["plan"]["tied"][0]["devices"] == ([0] if schedule in ("zbv", "dualpipev") else [0, 1])
    if schedule != "1f1b":
        assert len([c for c in case["plan"]["chunks"] if c["region"] == "llm"]) == (4 if V2[1] in extra else 2)
    assert_matches_reference(case)


@pytest.mark.msrun
@pytest.mark.parametrize("schedule,frozen", QWEN2_CASES_2)
def test_qwen2_shaped_two_ranks_match_reference(two_rank, schedule, frozen):
    case = two_rank[_name(QWEN2, schedule, frozen)]
    assert case["raw"]["model"]["model_config"]["qkv_has_bias"] is True
    assert case["raw"]["model"]["model_config"]["n_kv_heads"] < case["raw"]["model"]["model_config"]["num_heads"]
    assert_matches_reference(case)
    _, grads = _dumped(case)
    assert "model.layers.0.attention.wq.bias" in grads  # the q/k/v biases are trained


@pytest.mark.msrun
def test_llama_on_conversation_data_matches_reference_and_learns(two_rank):
    """recipes/mf_llama_mllm_data.yaml: MindFormers' Llama MLLM on LLaVA-style conversations with image
    files (decoded by mindspore.dataset), transpose on 2 ranks, equals the reference; the loss falls."""
    case = next(c for c in two_rank.values() if c["path"] == DATA)
    assert case["raw"]["data"]["type"] == "conversations" and case["raw"]["data"]["shape_buckets"] == "pow2"
    # the padded micro-batches, compiled, train exactly like the reference on the unpadded ones
    assert_equivalent(case, *reference(DATA, False, [e for e in case["extra"] if e not in BUCKETS] +
                                       ["data.shape_buckets=none"], DATA_STEPS))
    losses, _ = _dumped(case)
    assert len(losses) == DATA_STEPS and np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.3, losses
    # every chunk ran compiled, one graph per shape, and the buckets bound the shapes below the raw data's
    from hyperparallel.runconfig import RunConfig
    raw = dict(case["raw"]["data"], shape_buckets="none")
    shapes = {}
    for key, data in (("pow2", case["raw"]["data"]), ("none", raw)):
        src = RunConfig.from_raw(dict(case["raw"], data=data)).source()
        shapes[key] = {(mb.num_images, len(mb.text_ids)) for mb in
                       (src.micro_batch(s, g) for s in range(DATA_STEPS) for g in range(src.cfg.micro_per_step))}
        src.close()
    assert len(shapes["pow2"]) < len(shapes["none"]) / 2, shapes
    stats = compile_stats(case)
    assert stats and all(s["mode"] == "jit" and s["compiles"] + s["reused"] == s["shapes"] for s in stats), stats
    first = [s for s in stats if s["chunk"] in ("llm/0", "vision/0")]
    assert first and all(s["shapes"] <= len(shapes["pow2"]) for s in first), (stats, shapes)


@pytest.fixture(scope="module")
def four_rank(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("mf4"))
    cases = [_case(tmp, LLAMA, "transpose", False, P4), _case(tmp, QWEN2, "transpose(backward=central)", False, P4)]
    _run(tmp, cases, 4)
    return {c["name"]: c for c in cases}


@pytest.mark.msrun
@pytest.mark.parametrize("path,schedule", [(LLAMA, "transpose"), (QWEN2, "transpose(backward=central)")],
                         ids=["llama_transpose", "qwen2_transpose_central"])
def test_four_ranks_transpose_matches_reference(four_rank, path, schedule):
    case = four_rank[_name(path, schedule, False, P4)]
    assert case["plan"]["num_devices"] == 4
    assert_matches_reference(case)
