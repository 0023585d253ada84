"""Real-shaped MindFormers configs planned as MindFormers runs them: offset layouts (flat, nested),
interleave on and off, every pipeline_scheduler value, seq_split_num, and a vision-language config
with nested towers and freeze_vision. The layout rule is checked against MindFormers' own
LayerSetting (run in a subprocess: it imports MindSpore)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from hyperparallel.recipe import derive_recipe, load_recipe
from hyperparallel.mpipe.cost import simulate
from hyperparallel.errors import SpecError
from hyperparallel.mpipe.orders import ORDERS
from hyperparallel.recipe.mindformers import layer_layout

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VL = os.path.join(ROOT, "tests", "data", "mindformers", "qwen2_vl_7b_freeze_vision.yaml")
HAVE_MF = importlib.util.find_spec("mindformers") is not None
ZBV = "zbv" in ORDERS

# A Llama-style MindFormers 1.9 training config (the keys and sections MindFormers' llama configs
# have); {..} fields are filled per test.
LLAMA = """\
seed: 0
run_mode: 'train'
output_dir: './output'
use_parallel: True
context:
  mode: 0
  device_target: "Ascend"
  max_device_memory: "58GB"
parallel:
  parallel_mode: 1
  gradients_mean: False
  enable_alltoall: False
  full_batch: True
  search_mode: "sharding_propagation"
  enable_parallel_optimizer: True
  pipeline_config:
    pipeline_interleave: {interleave}
    pipeline_scheduler: {scheduler}
parallel_config:
  data_parallel: 2
  model_parallel: 4
  pipeline_stage: {P}
  micro_batch_num: {M}
  use_seq_parallel: True
  vocab_emb_dp: False
  gradient_aggregation_group: 4
micro_batch_interleave_num: 1
recompute_config:
  recompute: True
  select_recompute: False
runner_config:
  epochs: 1
  batch_size: 1
  sink_mode: True
  sink_size: 1
model:
  model_config:
    type: LlamaConfig
    batch_size: 1
    seq_length: 4096
    hidden_size: 5120
    num_layers: {L}
    num_heads: 40
    n_kv_heads: 8
    vocab_size: 125696
    rms_norm_eps: 1.0e-5
    {offset}
    {V}
    use_flash_attention: True
    compute_dtype: "bfloat16"
  arch:
    type: LlamaForCausalLM
"""


def llama(tmp_path, L=40, P=4, M=8, V=None, offset=None, interleave=False, scheduler="1f1b", extra=""):
    text = LLAMA.format(L=L, P=P, M=M, interleave=interleave, scheduler=scheduler,
                        offset="" if offset is None else f"offset: {json.dumps(offset)}",
                        V="" if V is None else f"pp_interleave_num: {V}") + extra
    path = tmp_path / "llama.yaml"
    path.write_text(text)
    return str(path)


def cut(recipe, schedule=None):
    plan = derive_recipe(recipe, schedule)
    return plan, [c.layers for c in plan.chunks if c.region == "llm"]


# -- offset -------------------------------------------------------------------------------------
def test_flat_offset_sets_the_cut_plan_and_simulate(tmp_path, cli):
    """40 layers on 4 stages, offset [-1, 0, 2, -1]: MindFormers' 9, 10, 12, 9 (not 10 x 4)."""
    p = llama(tmp_path, offset=[-1, 0, 2, -1])
    r = load_recipe(p)
    assert (r.pipeline_stage, r.pp_interleave_num, r.schedule) == (4, 1, "1f1b")
    plan, layers = cut(r)
    assert layers == [9, 10, 12, 9]
    assert [c.devices for c in plan.chunks] == [(0,), (1,), (2,), (3,)]
    rep = simulate(plan, r.profile)
    # costs estimated from the model config: every layer costs the same, so busy time follows the cut
    per_layer = [d.busy_ms / n for d, n in zip(rep.devices, layers)]
    assert per_layer[0] == pytest.approx(per_layer[1]) == pytest.approx(per_layer[2]), per_layer
    assert per_layer[3] > per_layer[2]   # the last chunk also runs the LM head
    out = cli("plan", p)
    assert out.returncode == 0, out.stderr
    # the config's recompute_config.recompute: True recomputes every chunk (R)
    assert "layers llm: 9@0R 10@1R 12@2R 9@3R" in out.stdout


def test_nested_offset_interleaved(tmp_path):
    """36 layers, P=4, V=2 (interleave on): base 4, remainder 4 placed by a V x P offset."""
    off = [[1, 1, 0, 0], [0, 0, 1, 1]]
    r = load_recipe(llama(tmp_path, L=36, V=2, offset=off, interleave=True))
    assert (r.pp_interleave_num, r.v_key, r.schedule) == (2, "model.model_config.pp_interleave_num", "interleaved")
    plan, layers = cut(r)
    assert layers == [5, 5, 4, 4, 4, 4, 5, 5]
    assert [c.devices[0] for c in plan.chunks] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_interleave_off_means_one_virtual_stage(tmp_path):
    """pp_interleave_num 2 with pipeline_interleave False: MindFormers' LayerSetting runs V = 1."""
    r = load_recipe(llama(tmp_path, V=2, offset=[1, 0, 0, -1], interleave=False))
    assert (r.pp_interleave_num, r.schedule) == (1, "1f1b")
    assert cut(r)[1] == [11, 10, 10, 9]


def test_without_offset_mindformers_default_or_refused(tmp_path):
    assert cut(load_recipe(llama(tmp_path, L=40)))[1] == [10, 10, 10, 10]
    with pytest.raises(SpecError) as e:
        load_recipe(llama(tmp_path, L=42))
    assert e.value.field == "model.model_config.offset"
    assert "absent (MindFormers' default 0)" in str(e.value) and "= 2" in str(e.value)
    assert "offset: [1, 1, 0, 0]" in str(e.value)


def test_project_recipes_keep_the_even_split():
    r = load_recipe(os.path.join(ROOT, "recipes", "tiny_mllm.yaml"), ["parallel_config.pipeline_stage=3"])
    assert r.layout is None and cut(r)[1] == [2, 1, 1]


@pytest.mark.parametrize("kw,words", [
    (dict(offset=[1, 0, 0]), "3 entries; MindFormers needs pipeline_stage (4)"),
    (dict(offset=[[1, 0, 0, -1], [0, 0, 0, 0]], V=2), "2 rows; MindFormers needs pp_interleave_num (1)"),
    (dict(offset=[[1, 0, 0, -1]], V=2, interleave=True), "1 rows; MindFormers needs pp_interleave_num (2)"),
    (dict(offset=[1, 0, 0, 0]), "sums to 1; MindFormers requires the offsets to sum to"),
    (dict(offset=[5, -10, 5, 0]), "every middle chunk >= 1"),
    (dict(offset=[-10, 10, 0, 0]), "leaves pipeline chunk 0 (virtual stage 0, stage 0) without layers"),
    (dict(offset="two"), "must be a whole number, a list of pipeline_stage (4)"),
    (dict(L=34, V=2, offset=2, interleave=True), "leaves pipeline chunk 6"),
])
def test_bad_offsets_are_refused_naming_the_key(tmp_path, kw, words):
    with pytest.raises(SpecError) as e:
        load_recipe(llama(tmp_path, **kw))
    assert e.value.field == "model.model_config.offset" and words in str(e.value)
    assert "\n" not in str(e.value)


# -- pipeline_scheduler, pipeline_interleave, pp_interleave_num, seq_split_num -----------------------
@pytest.mark.parametrize("scheduler,interleave,V,order", [
    ("1f1b", False, None, "1f1b"),
    ("1f1b", False, 2, "1f1b"),          # interleave off: V = 1
    ("1f1b", True, None, "1f1b"),
    ("1f1b", True, 2, "interleaved"),
    ("gpipe", True, None, "gpipe"),
    ("gpipe", True, 2, "gpipe"),
])
def test_scheduler_keys_give_the_order(tmp_path, scheduler, interleave, V, order):
    r = load_recipe(llama(tmp_path, scheduler=scheduler, interleave=interleave, V=V))
    assert r.schedule == order
    plan = derive_recipe(r)
    assert plan.meta["order"] == order and plan.meta["pp_interleave_num"] == (V if interleave and V else 1)


@pytest.mark.parametrize("kw,field,words", [
    (dict(scheduler="seqpipe", interleave=True), "parallel.pipeline_config.pipeline_scheduler",
     "'seqpipe' (sequence-pipelined) has no order in the schedule algebra; supported: 1f1b, gpipe"),
    (dict(scheduler="seqvpp", interleave=True, V=2), "parallel.pipeline_config.pipeline_scheduler", "'seqvpp'"),
    (dict(scheduler="seqsmartvpp", interleave=True, V=2), "parallel.pipeline_config.pipeline_scheduler",
     "'seqsmartvpp'"),
    (dict(scheduler="gpipe", interleave=False), "parallel.pipeline_config.pipeline_scheduler",
     "needs parallel.pipeline_config.pipeline_interleave: true"),
    (dict(scheduler="wave"), "parallel.pipeline_config.pipeline_scheduler",
     "allowed: gpipe, 1f1b, seqpipe, seqvpp, seqsmartvpp, zero_bubble_v"),
    (dict(interleave="maybe"), "parallel.pipeline_config.pipeline_interleave", "must be true or false"),
])
def test_unsupported_scheduler_keys_are_refused(tmp_path, kw, field, words):
    with pytest.raises(SpecError) as e:
        load_recipe(llama(tmp_path, **kw))
    assert e.value.field == field and words in str(e.value)


def test_seq_split_num_refused_even_with_mpipe_schedule(tmp_path):
    with pytest.raises(SpecError) as e:
        load_recipe(llama(tmp_path), ["parallel_config.seq_split_num=2"])
    assert e.value.field == "parallel_config.seq_split_num" and "supported: 1" in str(e.value)
    with pytest.raises(SpecError) as e:
        load_recipe(llama(tmp_path), ["parallel_config.seq_split_num=4", "mpipe={schedule: 1f1b}"])
    assert e.value.field == "parallel_config.seq_split_num"
    assert load_recipe(llama(tmp_path), ["parallel_config.seq_split_num=1"]).schedule == "1f1b"


@pytest.fixture
def with_zbv():
    """The zero_bubble_v mapping looks the ZB-V order up in the schedule library at run time."""
    assert ZBV, "the schedule library must have the zbv order"


def test_zero_bubble_v_maps_to_zbv_once_the_library_has_it(tmp_path, with_zbv):
    off = [[1, 0, 0, -1], [0, 1, -1, 0]]
    r = load_recipe(llama(tmp_path, L=16, M=8, V=2, offset=off, scheduler="zero_bubble_v", interleave=True))
    assert r.schedule == "zbv"
    assert list(r.chunk_layers("zbv")) == [3, 2, 2, 1, 2, 1, 3, 2]   # second row reversed, as LayerSetting
    assert list(r.chunk_layers("interleaved")) == [3, 2, 2, 1, 2, 3, 1, 2]


@pytest.mark.parametrize("kw,field", [
    (dict(L=24, M=8, V=3), "model.model_config.pp_interleave_num"),
    (dict(L=16, M=6, V=2), "parallel_config.micro_batch_num"),
    (dict(L=16, M=8, V=2, P=1), "parallel_config.pipeline_stage"),
])
def test_zero_bubble_v_checks_of_mindformers(tmp_path, with_zbv, kw, field):
    with pytest.raises(SpecError) as e:
        load_recipe(llama(tmp_path, scheduler="zero_bubble_v", interleave=True, **kw))
    assert e.value.field == field


@pytest.mark.skipif(not ZBV, reason="the schedule library has no zbv order yet")
def test_zero_bubble_v_derives_with_the_real_zbv_order(tmp_path):
    off = [[1, 0, 0, -1], [0, 1, -1, 0]]
    r = load_recipe(llama(tmp_path, L=16, M=8, V=2, offset=off, scheduler="zero_bubble_v", interleave=True))
    plan, layers = cut(r)
    assert plan.meta["order"] == "zbv" and layers == [3, 2, 2, 1, 2, 1, 3, 2]


def test_v_errors_name_the_key_the_user_set(tmp_path, cli):
    p = llama(tmp_path, V=2, interleave=True)
    with pytest.raises(SpecError) as e:
        derive_recipe(load_recipe(p), "1f1b")
    assert e.value.field == "model.model_config.pp_interleave_num"
    out = cli("plan", p, "--schedule", "zb_h1")
    assert out.returncode == 2 and out.stderr.startswith("error: model.model_config.pp_interleave_num: must be 1")


def test_no_silent_substitute_with_an_mpipe_schedule(tmp_path):
    """mpipe.schedule is used as given; the recipe's offset still cuts it."""
    p = llama(tmp_path, offset=[-1, 0, 2, -1], extra="mpipe: {schedule: gpipe}\n")
    plan, layers = cut(load_recipe(p))
    assert plan.meta["order"] == "gpipe" and layers == [9, 10, 12, 9]


# -- explicit per-chunk layers in the list form ------------------------------------------------
TINY = os.path.join(ROOT, "recipes", "tiny_mllm.yaml")


def lst(layers, order="1f1b"):
    return [{"region": "vision", "skeleton": "place"},
            {"region": "llm", "skeleton": "pipe", "order": order, "layers": layers}]


def test_list_form_layers():
    r = load_recipe(TINY)
    plan, layers = cut(r, lst([3, 1]))
    assert layers == [3, 1] and plan.schedule[-1]["layers"] == [3, 1]
    r = load_recipe(TINY, ["parallel_config.pp_interleave_num=2", "mpipe.profile.regions.1.layers=5"])
    plan, layers = cut(r, lst([2, 1, 1, 1], "interleaved"))
    assert layers == [2, 1, 1, 1] and [c.devices[0] for c in plan.chunks if c.region == "llm"] == [0, 1, 0, 1]


@pytest.mark.parametrize("layers,field,words", [
    ([4], "schedule.llm.layers", "1 entries; give one per chunk: pipeline_stage x pp_interleave_num = 2 x 1 = 2"),
    ([2, 1], "schedule.llm.layers", "sums to 3; region 'llm' has 4 layers"),
    ([4, 0], "schedule[1].layers", "whole numbers >= 1"),
    ("3,1", "schedule[1].layers", "whole numbers >= 1"),
])
def test_list_form_layers_refused(layers, field, words):
    with pytest.raises(SpecError) as e:
        derive_recipe(load_recipe(TINY), lst(layers))
    assert e.value.field == field and words in str(e.value)


def test_list_form_layers_must_agree_with_offset(tmp_path):
    p = llama(tmp_path, offset=[-1, 0, 2, -1])
    assert cut(load_recipe(p), [{"region": "llm", "skeleton": "pipe", "layers": [9, 10, 12, 9]}])[1] == [9, 10, 12, 9]
    with pytest.raises(SpecError) as e:
        derive_recipe(load_recipe(p), [{"region": "llm", "skeleton": "pipe", "layers": [10, 10, 10, 10]}])
    assert e.value.field == "schedule.llm.layers" and "contradicts model.model_config.offset" in str(e.value)


# -- vision-language config: nested towers, freeze flags ---------------------------------------
def test_vl_towers_and_freeze_vision():
    r = load_recipe(VL)
    assert [(x.name, x.layers, x.trainable) for x in r.profile.regions] == [("vision", 32, False), ("llm", 28, True)]
    assert r.layout["key"] == "model.model_config.llm_model.model_config.offset"
    plan, layers = cut(r)
    assert layers == [6, 8, 8, 6] and plan.trainable == {"vision": False, "llm": True}
    assert cut(load_recipe(VL, ["model.model_config.freeze_vision=false"]))[0].trainable["vision"] is True


def test_vl_simulate_1f1b_vs_transpose_without_a_profile(cli):
    """Costs estimated from the model config: with sixteen 1024-patch images per sample (the encoder's
    work now exceeds what device 0's short first chunk absorbs) the frozen encoder leaves device 0's
    critical path under transpose; the estimate's assumptions are stated."""
    heavy = ["--set", "data={images_per_sample: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], "
                      "video_prob: 0, image_size: 448, patch: 14, text_len: 4080}",
             # without the config's LLM recompute: with it (one more forward in every LLM backward) the LLM's
             # work per micro-batch grows and 1F1B's inline encoder costs less than transpose's prefixes here
             "--set", "recompute_config.recompute=false"]
    out = cli("simulate", VL, "--schedule", "1f1b", "--schedule", "transpose", "--json", *heavy)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [x["schedule"] for x in rows] == ["1f1b", "transpose"]
    assert rows[1]["makespan_ms"] < rows[0]["makespan_ms"]
    assert "16.00 images per sample (data.images_per_sample)" in rows[0]["costs"]
    assert "1024 patches per image (448/14 squared)" in rows[0]["costs"]
    out = cli("simulate", VL)
    assert out.returncode == 0, out.stderr
    assert "note: costs estimated from the model config" in out.stdout and ("1.77 images per sample (the generated "
                                                                                   "data's default mix)") in out.stdout


@pytest.mark.parametrize("override,field,words", [
    ("model.model_config.freeze_vision=maybe", "model.model_config.freeze_vision", "true or false"),
    ("mpipe={encoder: {trainable: true}}", "model.model_config.freeze_vision",
     "contradicts mpipe.encoder.trainable: True"),
    ("model.model_config.llm_model.model_config.offset=[0, 1, 1, -1]",
     "model.model_config.llm_model.model_config.offset", "sums to 1"),
    ("parallel_config.pipeline_stage=40", "model.model_config.llm_model.model_config.num_layers",
     "28 layers cannot be cut into pipeline_stage x pp_interleave_num = 40 x 1"),
])
def test_vl_refusals(override, field, words):
    with pytest.raises(SpecError) as e:
        load_recipe(VL, [override])
    assert e.value.field == field and words in str(e.value)


# -- the rule against MindFormers' own LayerSetting --------------------------------------------
CASES = [  # (num_layers, offset, P, V, pipeline_interleave, pipeline_scheduler)
    (40, [-1, 0, 2, -1], 4, 1, False, "1f1b"),
    (40, 0, 4, 1, False, "1f1b"),
    (42, 0, 4, 1, False, "1f1b"),
    (36, [[1, 1, 0, 0], [0, 0, 1, 1]], 4, 2, True, "1f1b"),
    (32, [1, -1, 0, 0], 4, 2, True, "1f1b"),
    (33, [1, 0, 0, 0], 4, 2, True, "1f1b"),
    (34, 2, 4, 2, True, "1f1b"),
    (40, [[1, 0, 0, -1]], 4, 2, True, "1f1b"),
    (40, [[1, 0, 0, -1], [0, 0, 0, 0]], 4, 2, False, "1f1b"),
    (12, 0, 4, 2, False, "1f1b"),
    (40, [1, 0, 0], 4, 1, False, "1f1b"),
    (40, [-10, 10, 0, 0], 4, 1, False, "1f1b"),
    (40, [5, -10, 5, 0], 4, 1, False, "1f1b"),
    (41, [1, -1], 2, 1, True, "gpipe"),
    (41, [1, 0], 2, 1, True, "gpipe"),
    (28, [[0, 1, 0], [0, 0, -1]], 3, 2, True, "gpipe"),
    (16, [[1, 0, 0, -1], [0, 1, -1, 0]], 4, 2, True, "zero_bubble_v"),
    (24, [[0, 0, 0, 0], [1, 0, 0, -1]], 4, 2, True, "zero_bubble_v"),
    (40, 0, 1, 1, False, "1f1b"),
]

LAYER_SETTING = """
import json, sys
import numpy as np
import mindspore as ms
from mindformers.parallel_core.training_graph.transformer.utils import LayerSetting
from mindformers.modules.transformer.transformer import TransformerOpParallelConfig
for L, off, P, V, inter, sched in json.loads(sys.argv[1]):
    ms.set_auto_parallel_context(pipeline_stages=P, pipeline_config={"pipeline_interleave": inter,
                                                                     "pipeline_scheduler": sched})
    try:
        s = LayerSetting(L, off, TransformerOpParallelConfig(pipeline_stage=P), V)
        n = P * s.pp_interleave_num
        chunk = [int(np.searchsorted(s.layer_accu.reshape(-1), i + 1)) for i in range(L)]
        print("OUT", json.dumps([s.pp_interleave_num, [chunk.count(c) for c in range(n)]]))
    except ValueError as e:
        print("OUT", json.dumps(["error", str(e)]))
"""


@pytest.mark.skipif(not HAVE_MF, reason="mindformers is not installed (requirements.txt pins 1.9.0)")
@pytest.mark.slow
def test_layout_equals_mindformers_layer_setting(tmp_path):
    env = dict(os.environ, GLOG_v="3")
    r = subprocess.run([sys.executable, "-c", LAYER_SETTING, json.dumps(CASES)], cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    got = [json.loads(l[4:]) for l in r.stdout.splitlines() if l.startswith("OUT ")]
    assert len(got) == len(CASES)
    refused_empty = 0
    for (L, off, P, V, inter, sched), mf in zip(CASES, got):
        v_eff = V if inter else 1   # the recipe's rule for V
        try:
            ours = list(layer_layout(L, off, P, v_eff, zbv=sched == "zero_bubble_v"))
        except SpecError as e:
            if mf[0] != "error":   # MindFormers accepts it: only an empty chunk may make us refuse
                assert mf[0] == v_eff and 0 in mf[1] and "without layers" in str(e), (L, off, mf, str(e))
                refused_empty += 1
            continue
        assert mf == [v_eff, ours], (L, off, P, V, inter, sched)
    assert refused_empty == 2


def test_interleave_read_as_one_says_what_turns_it_on(tmp_path):
    """pp_interleave_num 2 without pipeline_interleave reads as 1 (MindFormers' rule); a refusal about V
    said "got 1" and not why: it names parallel.pipeline_config.pipeline_interleave: true (issue 40)."""
    for interleave, why in ((False, "is false"), (None, "is absent")):
        p = llama(tmp_path, L=8, V=2, interleave=interleave)
        if interleave is None:
            text = open(p).read().replace("  pipeline_config:\n    pipeline_interleave: None\n"
                                          "    pipeline_scheduler: 1f1b\n", "")
            assert "pipeline_config" not in text
            open(p, "w").write(text)
        with pytest.raises(SpecError) as e:
            derive_recipe(load_recipe(p), "dualpipev")
        msg = str(e.value)
        assert msg.startswith("model.model_config.pp_interleave_num: must be 2 for order 'dualpipev'"), msg
        assert (f"model.model_config.pp_interleave_num: 2 reads as 1 because parallel.pipeline_config."
                f"pipeline_interleave {why}") in msg and "pipeline_interleave: true" in msg, msg
    # a V the recipe did not set above 1 gets no note
    with pytest.raises(SpecError) as e:
        derive_recipe(load_recipe(llama(tmp_path, L=8)), "dualpipev")
    assert "reads as 1" not in str(e.value)
