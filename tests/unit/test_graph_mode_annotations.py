"""Graph-mode annotations: the plan's placement as cell.pipeline_stage on the tiny MLLM, checked as data.

(Compiling a graph-mode pipeline needs Ascend or GPU; on CPU we check what would be compiled.)
"""
import os

import pytest

from hyperparallel.runtime.annotate import GraphModeUnsupported, graph_pipeline
from hyperparallel.recipe import derive_recipe, load_recipe
from helpers import recipe

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(ROOT, "recipes", "tiny_mllm.yaml")


def plan_of(schedule, *overrides, recipe=TINY):
    return derive_recipe(load_recipe(recipe, list(overrides)), schedule)


# -- settings only: pure Python, no MindSpore needed ---------------------------------------------
@pytest.mark.parametrize("schedule,overrides,expect", [
    ("1f1b", (), dict(interleave=False, scheduler="1f1b", virtual_stages=1)),
    ("gpipe", (), dict(interleave=True, scheduler="gpipe", virtual_stages=1)),
    ("interleaved", ("parallel_config.pp_interleave_num=2",), dict(interleave=True, scheduler="1f1b",
                                                                    virtual_stages=2)),
    ("zbv", ("parallel_config.pp_interleave_num=2",), dict(interleave=True, scheduler="zero_bubble_v",
                                                            virtual_stages=2)),
])
def test_pipeline_settings(schedule, overrides, expect):
    gp = graph_pipeline(plan_of(schedule, *overrides))
    assert (gp.stages, gp.micro_batches) == (2, 4)
    for k, v in expect.items():
        assert getattr(gp, k) == v
    mf = gp.mindformers()
    assert mf["parallel_config"] == {"data_parallel": 1, "pipeline_stage": 2, "micro_batch_num": 4}
    assert mf["parallel"]["pipeline_config"] == {"pipeline_interleave": expect["interleave"],
                                                 "pipeline_scheduler": expect["scheduler"]}
    assert mf["model"]["model_config"]["pp_interleave_num"] == expect["virtual_stages"]
    assert gp.auto_parallel_pipeline_kwargs() == {"stages": 2, "interleave": expect["interleave"],
                                                  "scheduler": expect["scheduler"]}


def test_settings_are_accepted_by_mindspore_pipeline_api():
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    from mindspore.parallel.auto_parallel import AutoParallel
    from mindspore import nn
    for sched, ov in (("1f1b", ()), ("gpipe", ()), ("interleaved", ("parallel_config.pp_interleave_num=2",)),
                      ("zbv", ("parallel_config.pp_interleave_num=2",))):
        gp = graph_pipeline(plan_of(sched, *ov))
        ap = AutoParallel(nn.Dense(2, 2), parallel_mode="semi_auto")
        ap.pipeline(**gp.auto_parallel_pipeline_kwargs())   # MindSpore validates and stores them
        assert (ap._pipeline_stages, ap._pipeline_interleave, ap._pipeline_scheduler) == \
            (gp.stages, gp.interleave, gp.scheduler), sched


def test_scheduler_names_are_the_ones_mindspore_accepts():
    """The recipe rules' scheduler list, and every order's graph-mode scheduler in the registry, are
    exactly the names MindSpore's own AutoParallel.pipeline accepts."""
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    from mindspore.parallel.auto_parallel import AutoParallel
    from mindspore import nn
    from hyperparallel.mpipe.orders import ORDERS
    from hyperparallel.recipe.mindformers import SCHEDULERS

    def accepted(name):
        try:
            AutoParallel(nn.Dense(2, 2), parallel_mode="semi_auto").pipeline(stages=2, scheduler=name)
            return True
        except ValueError:
            return False
    assert all(accepted(s) for s in SCHEDULERS) and not accepted("wave")
    graph = {o.mindspore[0] for o in ORDERS.values() if o.mindspore}
    assert graph <= set(SCHEDULERS) and graph == {"1f1b", "gpipe", "zero_bubble_v"}


@pytest.mark.parametrize("schedule,field,words", [
    ("transpose", "schedule", ["PyNative runtime", "hyperparallel train"]),
    ("transpose(backward=central)", "schedule", ["PyNative runtime"]),
    ("zb_h1", "schedule.order", ["zero_bubble_v", "V-shape"]),
    ("1f1b(device=1)", "schedule.vision.device", ["must not decrease", "device 0"]),
])
def test_refused_schedules(schedule, field, words):
    _refused(schedule, field, words)


@pytest.mark.parametrize("schedule", ["interleaved_zb", "dualpipev"])
def test_refused_zero_bubble_orders_other_than_zbv(schedule):
    _refused(schedule, "schedule.order", ["zero_bubble_v", "zbv", "hyperparallel train"],
             "parallel_config.pp_interleave_num=2")


def _mindformers_zbv_stages(num_layers, pp):
    """MindFormers 1.9 LayerSetting under zero_bubble_v (uniform layers, no offset), restated:
    a (2, pp) grid of layer counts with the second row reversed, stage = searchsorted(cumulative,
    i + 1) mod pp, and pp - 1 - stage with pipeline_segment 1 for the second row."""
    import numpy as np
    grid = np.ones((2, pp), np.int32) * (num_layers // (2 * pp))
    grid[1] = grid[1][::-1]
    accu = np.cumsum(grid, axis=1) + np.insert(np.cumsum(grid.sum(axis=1))[:-1], 0, 0).reshape(-1, 1)
    out = []
    for i in range(num_layers):
        pp_id = int(np.searchsorted(accu.reshape(-1), i + 1) % pp)
        seg = int(np.where(i < accu)[0][0])
        out.append((pp - 1 - pp_id if seg == 1 else pp_id, seg))
    return out


@pytest.mark.parametrize("P,layers", [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_zbv_placement_is_mindformers_zero_bubble_v_assignment(P, layers):
    from hyperparallel.mpipe import derive
    from helpers import profile
    plan = derive(profile(("llm", layers, True)), "zbv", P, 2 * P, 2)
    ours = []
    for c in sorted(plan.chunks, key=lambda c: c.start):
        ours += [(c.devices[0], c.index // P)] * c.layers
    assert ours == _mindformers_zbv_stages(layers, P)


def _refused(schedule, field, words, *overrides):
    with pytest.raises(GraphModeUnsupported) as e:
        graph_pipeline(plan_of(schedule, *overrides))
    assert e.value.field == field
    for w in words:
        assert w in str(e.value)


def test_ascend_recipe_settings():
    # graph mode carries no schedule recompute (MindSpore's recompute_config does it): the recipe's is turned off
    r72 = os.path.join(ROOT, "recipes", "qwen2_5_vl_72b.yaml")
    with pytest.raises(GraphModeUnsupported, match="schedule.llm.recompute"):
        graph_pipeline(plan_of("interleaved", recipe=r72))
    gp = graph_pipeline(plan_of("interleaved", "mpipe.recompute=none", recipe=r72))
    assert gp.mindformers() == {
        "parallel_config": {"data_parallel": 8, "pipeline_stage": 8, "micro_batch_num": 32},
        "parallel": {"pipeline_config": {"pipeline_interleave": True, "pipeline_scheduler": "1f1b"}},
        "model": {"model_config": {"pp_interleave_num": 2, "offset": 0}},
    }
    assert gp.frozen_regions == ["vision"]
    with pytest.raises(GraphModeUnsupported, match="PyNative"):
        graph_pipeline(plan_of(None, "mpipe.recompute=none", recipe=r72))


@pytest.mark.parametrize("schedule,overrides", [
    ("1f1b", ("parallel_config.pipeline_stage=4",)),                       # 4 layers on 4: offset 0
    ("1f1b", ("parallel_config.pipeline_stage=3",)),                       # 2, 1, 1: offset [1, 0, 0]
    ("[{region: vision, skeleton: place}, {region: llm, skeleton: pipe, order: 1f1b, layers: [3, 1]}]", ()),
    ("interleaved", ("parallel_config.pp_interleave_num=2", "mpipe.profile.regions.1.layers=6")),
])
def test_emitted_offset_makes_mindformers_cut_like_the_plan(schedule, overrides):
    """gp.mindformers()'s offset, fed to MindFormers' layout rule, gives the plan's own layers per chunk."""
    from hyperparallel.recipe.mindformers import layer_layout
    plan = plan_of(schedule, *overrides)
    gp = graph_pipeline(plan)
    mc = gp.mindformers()["model"]["model_config"]
    llm = [c.layers for c in plan.chunks if c.region == "llm"]
    assert list(layer_layout(sum(llm), mc["offset"], gp.stages, mc["pp_interleave_num"])) == llm
    if len(set(llm)) > 1:
        assert mc["offset"] != 0


# -- on the tiny MLLM's cells (MindSpore needed to build them) -------------------------------------
@pytest.fixture(scope="module")
def tiny():
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    from hyperparallel.runconfig import load_parsed
    rc = load_parsed(TINY).run
    return rc, rc.model.build_full, rc.model.build_chunk


def test_full_model_1f1b(tiny):
    from hyperparallel.runtime.annotate import annotate
    rc, build_full, _ = tiny
    vision, llm = model = build_full()
    gp = annotate(model, plan_of("1f1b"))
    # encoder place(0): every vision cell on stage 0; llm layers 0-1 stage 0, 2-3 stage 1
    assert vision.pipeline_stage == 0 and vision.proj.pipeline_stage == 0
    assert all(b.pipeline_stage == 0 for b in vision.blocks)
    assert [b.pipeline_stage for b in llm.blocks] == [0, 0, 1, 1]
    assert [b.attn.pipeline_stage for b in llm.blocks] == [0, 0, 1, 1]
    assert llm.pipeline_stage == 0 and llm.embed.pipeline_stage == 0   # embedding first, LM head last
    assert llm.head.pipeline_stage == 1 and llm.head.norm.pipeline_stage == 1
    assert gp.cell_stages["1.blocks.3.mlp"] == 1 and gp.cell_stages["0"] == 0
    ps = gp.param_stages
    assert ps["llm.-1.embed.tok"] == 0 and ps["llm.3.attn.wq"] == 1 and ps["llm.4.head.w"] == 1
    assert ps["vision.-1.patch.w"] == 0 and ps["vision.2.projector.w1"] == 0
    assert len(ps) == len(list(vision.get_parameters())) + len(list(llm.get_parameters()))
    # embedding, patch embedding and LM head are cells of their own: every operator on its stage
    assert gp.conflicts == []


def test_per_chunk_cells_interleaved(tiny):
    """The runtime's per-chunk cells, V=2: llm chunk c on device c mod 2 (MindSpore's cyclic placement)."""
    from hyperparallel.runtime.annotate import annotate
    rc, _, build_chunk = tiny
    plan = plan_of("interleaved", "parallel_config.pp_interleave_num=2")
    cells = {f"{c.region}{c.index}": build_chunk(c.region, c.start, c.stop) for c in plan.chunks}
    gp = annotate(cells, plan)
    assert [cells[f"llm{i}"].pipeline_stage for i in range(4)] == [0, 1, 0, 1]
    assert cells["vision0"].pipeline_stage == 0
    assert gp.conflicts == [] and gp.interleave and gp.virtual_stages == 2
    assert gp.param_stages["llm.4.head.w"] == 1 and gp.param_stages["llm.2.mlp.w1"] == 0


def test_per_chunk_cells_zbv_get_v_shape_stages_and_segments(tiny):
    """zbv, V=2 on 2 stages: llm chunks 0..3 on stages 0, 1, 1, 0 with pipeline_segment 0, 0, 1, 1."""
    from hyperparallel.runtime.annotate import annotate
    rc, _, build_chunk = tiny
    plan = plan_of("zbv", "parallel_config.pp_interleave_num=2")
    cells = {f"{c.region}{c.index}": build_chunk(c.region, c.start, c.stop) for c in plan.chunks}
    gp = annotate(cells, plan)
    assert [cells[f"llm{i}"].pipeline_stage for i in range(4)] == [0, 1, 1, 0]
    assert [cells[f"llm{i}"].pipeline_segment for i in range(4)] == [0, 0, 1, 1]
    assert cells["vision0"].pipeline_stage == 0 and cells["vision0"].pipeline_segment == 0
    assert gp.scheduler == "zero_bubble_v" and gp.conflicts == []
    assert gp.param_stages["llm.4.head.w"] == 0  # the last chunk (loss) is back on stage 0


def test_transpose_refused_before_touching_cells(tiny):
    from hyperparallel.runtime.annotate import annotate
    rc, build_full, _ = tiny
    model = build_full()
    with pytest.raises(GraphModeUnsupported, match="hyperparallel train"):
        annotate(model, plan_of("transpose"))
    with pytest.raises(AttributeError):
        model[0].pipeline_stage  # never set


def test_layer_of_override(tiny):
    from hyperparallel.runtime.annotate import annotate
    rc, build_full, _ = tiny
    model = build_full()
    # the final norm would go to the last stage by its parameters; the override pins it to layer 0's stage
    gp = annotate(model, plan_of("1f1b"), layer_of=lambda name, cell: ("llm", 0) if name == "1.head.norm" else None)
    assert model[1].head.norm.pipeline_stage == 0 and gp.cell_stages["1.head.norm"] == 0
    assert model[1].head.pipeline_stage == 1


def test_zbv_offset_lays_out_the_plan_cut_as_mindformers_reads_it():
    """An uneven zbv cut: the offset annotate writes, read back with MindFormers' rule (second row
    reversed for zero_bubble_v), gives the plan's layers per chunk."""
    from hyperparallel.recipe.mindformers import layer_layout
    sets = ["model.model_config.num_layers=8", "model.model_config.pp_interleave_num=2",
            "parallel.pipeline_config={pipeline_interleave: true, pipeline_scheduler: zero_bubble_v}",
            "model.model_config.offset=[[0, -1], [0, 1]]", "mpipe.schedule=zbv"]
    plan = derive_recipe(load_recipe(recipe("mf_llama_adamw.yaml"), sets))
    gp = graph_pipeline(plan)
    layers = [c.layers for c in sorted((c for c in plan.chunks if c.region == "llm"), key=lambda c: c.index)]
    assert layers == list(layer_layout(8, [[0, -1], [0, 1]], 2, 2, zbv=True)) and len(set(layers)) > 1
    assert gp.offset == [[0, -1], [0, 1]]   # what the recipe gave: the same cut
