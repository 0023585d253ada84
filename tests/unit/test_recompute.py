"""Activation recompute as part of the schedule (issue 37.2): the option, the derivation's split and R placement,
the laws it keeps, the checker's rules, the cost model's closed forms and held memory, the recipe keys."""
import os
import subprocess
import sys

import pytest

from hyperparallel.errors import PlanError, SpecError
from hyperparallel.mpipe import recompute as rc
from hyperparallel.mpipe.check import assert_valid, check
from hyperparallel.mpipe.cost import simulate
from hyperparallel.mpipe.derive import derive
from hyperparallel.mpipe.ir import BW, F, R, Plan
from hyperparallel.mpipe.profile import ModelProfile, RegionProfile
from hyperparallel.mpipe.schedule import parse_schedule
from hyperparallel.recipe import checked_plan, load_recipe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "recipes", "tiny_mllm.yaml")
MF = os.path.join(ROOT, "recipes", "mf_llama_adamw.yaml")


def _vlm(vision_trainable=True, llm_layers=8):
    return ModelProfile(regions=(
        RegionProfile("vision", 2, trainable=vision_trainable, forward_ms=2, backward_ms=2, weight_ms=1,
                      activation_mb=3, output_mb=0.5),
        RegionProfile("llm", llm_layers, forward_ms=1, backward_ms=1, weight_ms=0.5, activation_mb=1, output_mb=0.25)))


def _compute(plan, d):
    return [(a.kind, a.region, a.chunk, a.micro) for a in plan.programs[d] if a.is_compute]


def _pipeline_view(plan):
    """The programs with every R left out and each action's chunk read as the pipeline chunk it is a part of
    (the chunk of its first layer in the unsplit cut), consecutive repeats (the parts' tasks) merged."""
    by_start = {}
    for c in plan.chunks:
        by_start.setdefault(c.region, []).append(c)
    def pipe_index(region, chunk):
        cs = by_start[region]
        # the pipeline chunk = number of kept (not recomputed-and-followed-by-its-rest) boundaries before it
        idx = 0
        for i, c in enumerate(cs):
            if c.index == chunk:
                return idx
            split_here = c.recompute and i + 1 < len(cs) and cs[i + 1].devices == c.devices and not cs[i + 1].recompute
            if not split_here:
                idx += 1
        raise KeyError(chunk)
    out = {}
    for d, prog in plan.programs.items():
        seq = []
        for a in prog:
            if a.kind == R:
                continue
            key = (a.kind, a.region, None if a.chunk is None else pipe_index(a.region, a.chunk), a.micro, a.peer,
                   a.tensor, a.group, a.step)
            if not seq or seq[-1] != key or not a.is_compute:
                seq.append(key)
        out[d] = seq
    return out


# -- the option -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value,want", [("none", "none"), ("full", "full"), ("layers=2", "layers=2"),
                                        ("layers = 1", "layers=1"), ("layers=0", "none"), (True, "full"),
                                        (False, "none"), ([1, 0, 2], (1, 0, 2))])
def test_recompute_values_read_canonically(value, want):
    assert rc.parse("f", value) == want


@pytest.mark.parametrize("value", ["half", "layers=-1", "layers=x", 3, [1, -1], [True], []])
def test_a_bad_recompute_value_names_the_field_and_the_allowed_forms(value):
    with pytest.raises(SpecError) as e:
        rc.parse("schedule.llm.recompute", value)
    assert str(e.value).startswith("schedule.llm.recompute: ")
    if not isinstance(value, list):
        assert "allowed: none, full, layers=K" in str(e.value)


def test_short_names_carry_the_bodys_recompute_and_name_it_back():
    prof = _vlm()
    for text in ("1f1b(recompute=full)", "transpose(recompute=layers=2)", "interleaved(recompute=layers=1)"):
        s = parse_schedule(text, prof, V=2 if "interleaved" in text else 1)
        assert s.body[1].recompute == text.split("recompute=")[1].rstrip(")")
        assert s.name() == text
        assert [p.get("recompute") for p in s.to_list()] == [None, s.body[1].recompute]
    assert "recompute" not in parse_schedule("1f1b", prof).to_list()[1]   # the default stays out of plans
    s = parse_schedule([{"region": "vision", "skeleton": "transpose", "recompute": "full"},
                        {"region": "llm", "skeleton": "pipe", "recompute": [1, 0]}], prof)
    assert s.name() == "vision:transpose(recompute=full); llm:pipe(recompute=[1, 0])"


# -- derivation: the split and the R -------------------------------------------------------------------------

def test_full_recompute_puts_an_r_right_before_every_backward_on_the_forwards_device():
    plan = assert_valid(derive(_vlm(), "1f1b(recompute=full)", 2, 4))
    assert [(c.region, c.layers, c.recompute) for c in plan.chunks] == [("vision", 2, False), ("llm", 4, True),
                                                                          ("llm", 4, True)]
    for d in (0, 1):
        seq = _compute(plan, d)
        for i, (kind, region, chunk, m) in enumerate(seq):
            if region == "llm" and kind == BW:
                assert seq[i - 1] == (R, "llm", chunk, m)
                assert seq.index((F, "llm", chunk, m)) < i - 1
        assert sum(1 for t in seq if t[0] == R) == 4
    assert plan.to_json()["chunks"][1]["recompute"] is True and "recompute" not in plan.to_json()["chunks"][0]


def test_layers_k_splits_each_chunk_at_its_kth_layer_and_expands_its_tasks_in_place():
    plan = assert_valid(derive(_vlm(), "1f1b(recompute=layers=1)", 2, 2))
    llm = [(c.index, c.start, c.stop, c.devices, c.recompute) for c in plan.chunks if c.region == "llm"]
    assert llm == [(0, 0, 1, (0,), True), (1, 1, 4, (0,), False), (2, 4, 5, (1,), True), (3, 5, 8, (1,), False)]
    seq = _compute(plan, 1)
    assert seq[:4] == [(F, "llm", 2, 0), (F, "llm", 3, 0), (BW, "llm", 3, 0), (R, "llm", 2, 0)]
    assert seq[4] == (BW, "llm", 2, 0)
    # a recomputed part's output never leaves its device; the kept part's output is what moves
    sends = [(a.tensor, a.chunk) for a in plan.programs[0] if a.kind == "SEND" and a.region == "llm"]
    assert sends == [("act", 1), ("act", 1)]


@pytest.mark.parametrize("schedule,V", [("1f1b", 1), ("gpipe", 1), ("zb_h1", 1), ("interleaved", 2), ("zbv", 2),
                                        ("dualpipev", 2), ("transpose", 1), ("transpose(order=interleaved)", 2),
                                        ("transpose(backward=central)", 1), ("transpose(spill=next_step)", 1)])
@pytest.mark.parametrize("how", ["full", "layers=1"])
def test_recompute_changes_no_schedule_only_adds_rs(schedule, V, how):
    """Law: the recomputed plan with its R actions left out and every chunk read as its pipeline chunk is the
    plan without recompute, action for action; and it passes the checker."""
    frozen_encoder = "spill" in schedule
    prof = _vlm(vision_trainable=not frozen_encoder)
    plain = derive(prof, schedule, 2, 4, V)
    opt = f"recompute={how}"
    text = schedule[:-1] + f", {opt})" if schedule.endswith(")") else f"{schedule}({opt})"
    plan = derive(prof, text, 2, 4, V)
    assert check(plan) == []
    assert _pipeline_view(plan) == _pipeline_view(plain)
    n_llm = sum(1 for c in plan.chunks if c.region == "llm")
    assert n_llm == (2 * V if how == "full" else 4 * V)
    rs = sum(1 for p in plan.programs.values() for a in p if a.kind == R and a.region == "llm")
    assert rs == 4 * 2 * V   # one per recomputed chunk and micro-batch


def test_encoder_recompute_under_place_and_transpose_owner():
    for sk in ("place", "transpose"):
        plan = assert_valid(derive(_vlm(), [{"region": "vision", "skeleton": sk, "recompute": "full"},
                                            {"region": "llm", "skeleton": "pipe", "order": "1f1b"}], 2, 4))
        for d, prog in plan.programs.items():
            seq = _compute(plan, d)
            for i, t in enumerate(seq):
                if t[0] == BW and t[1] == "vision":
                    assert seq[i - 1] == (R, "vision", 0, t[3])


def test_recompute_of_a_region_without_backward_is_refused_naming_the_key():
    prof = _vlm(vision_trainable=False)
    with pytest.raises(SpecError) as e:
        derive(prof, [{"region": "vision", "skeleton": "place", "recompute": "full"},
                      {"region": "llm", "skeleton": "pipe"}], 2, 4)
    assert str(e.value) == ("schedule.vision.recompute: 'vision' has no backward (it and every region before it are "
                            "frozen): there is nothing to recompute; allowed: none")
    with pytest.raises(SpecError, match=r"^schedule.vision.recompute: backward=central recomputes 'vision' already"):
        derive(_vlm(), [{"region": "vision", "skeleton": "transpose", "backward": "central", "recompute": "full"},
                        {"region": "llm", "skeleton": "pipe"}], 2, 4)
    with pytest.raises(SpecError, match=r"^schedule.llm.recompute: 5 recomputed layers but chunk 0 has 4; allowed: "
                                        r"0..4"):
        derive(_vlm(), "1f1b(recompute=layers=5)", 2, 4)
    with pytest.raises(SpecError, match=r"^schedule.llm.recompute: \[1\] has 1 entries; the region has 2 chunks"):
        derive(_vlm(), [{"region": "vision", "skeleton": "place"},
                        {"region": "llm", "skeleton": "pipe", "recompute": [1]}], 2, 4)


# -- the checker knows it ---------------------------------------------------------------------------------

def _without(plan, pred):
    return Plan.from_json({**plan.to_json(), "programs": {str(d): [a.to_json() for a in p if not pred(a)]
                                                          for d, p in plan.programs.items()}})


def test_checker_needs_the_r_of_a_recomputed_chunk_before_its_backward():
    plan = derive(_vlm(), "1f1b(recompute=full)", 2, 2)
    errs = check(_without(plan, lambda a: a.kind == R and a.chunk == 1 and a.micro == 1))
    assert errs == ["R llm c1 m1 runs 0 times; the chunk is recomputed, expected once before its backward"]
    # the R moved after its backward: the backward has no tape to run on
    prog = [a.to_json() for a in plan.programs[1]]
    i = next(i for i, a in enumerate(prog) if a["kind"] == "R" and a["micro"] == 0)
    r = prog.pop(i)
    prog.insert(i + 1, r)
    moved = Plan.from_json({**plan.to_json(), "programs": {"0": [a.to_json() for a in plan.programs[0]], "1": prog}})
    (err,) = check(moved)
    assert err.startswith("device 1 action ") and "(BW llm c1 m0): needs stash of llm c1 m0" in err
    with pytest.raises(PlanError):
        assert_valid(moved)


# -- the cost model charges it ------------------------------------------------------------------------------

def _llm_only(P, f=1.0, b=1.0, w=0.5, act=1.0, out=0.25):
    return ModelProfile(regions=(RegionProfile("llm", P, forward_ms=f, backward_ms=b, weight_ms=w,
                                               activation_mb=act, output_mb=out),))


@pytest.mark.parametrize("P,M", [(2, 4), (4, 4), (4, 8), (3, 5)])
def test_full_recompute_1f1b_closed_forms(P, M):
    """Makespan (M + P - 1)(f + b + w) + M f: every backward is preceded by its forward again, but an R needs no
    gradient, so in the cooldown it runs while its device waits for one: only the last stage's M recomputes
    lengthen the critical path. Device s holds one forward's activations at a time and keeps the inputs of the
    min(P - s, M) forwards of 1F1B's warmup."""
    prof = _llm_only(P)
    plain = simulate(derive(prof, "1f1b", P, M), prof)
    rep = simulate(derive(prof, "1f1b(recompute=full)", P, M), prof)
    assert plain.makespan_ms == pytest.approx((M + P - 1) * 2.5)
    assert rep.makespan_ms == pytest.approx((M + P - 1) * 2.5 + M * 1.0)
    for s, d in enumerate(rep.devices):
        assert d.peak_held == {"llm": 1} and d.peak_held_total == 1
        kept = min(P - s, M) * (0.25 if s else 0.0)   # device 0's chunk reads the data (no profile size)
        # the last warmup forward's working layer (one chunk of one layer here) and the warmup's kept inputs
        assert d.peak_activation_mb == pytest.approx(1.0 + kept)
        assert plain.devices[s].peak_activation_mb == pytest.approx(min(P - s, M) * 1.0)


def test_layers_k_cost_between_none_and_full():
    """P=2, M=4, chunks of 4 layers (1 MB each), inputs 0.25 MB. Device 0 (1F1B holds 2 forwards): none 2 x 4;
    layers=1 two kept parts of 3; layers=3 the R's 3 with the other micro-batch's kept layer; full one R of 4
    (its chunk reads the data: nothing kept). Device 1 (one forward at a time): 4; the kept 3 and its input;
    the R's 3; the R's 4. More recompute, longer steps."""
    prof = ModelProfile(regions=(RegionProfile("llm", 8, forward_ms=1, backward_ms=1, weight_ms=0.5, activation_mb=1,
                                               output_mb=0.25),))
    reps = [simulate(assert_valid(derive(prof, f"1f1b(recompute={how})", 2, 4)), prof)
            for how in ("none", "layers=1", "layers=3", "full")]
    assert [[d.peak_activation_mb for d in r.devices] for r in reps] == [[8, 4], [6, 3.25], [4, 3], [4, 4]]
    spans = [r.makespan_ms for r in reps]
    assert spans[0] == 5 * 10 and spans[-1] == 5 * 10 + 4 * 4 and spans == sorted(set(spans))


# -- the recipe keys ------------------------------------------------------------------------------------------

def test_mpipe_recompute_applies_to_the_pipelined_region():
    plan = checked_plan(load_recipe(TINY, ["mpipe.recompute=layers=1"]))
    assert [(c.layers, c.recompute) for c in plan.chunks if c.region == "llm"] == [(1, True), (1, False)] * 2
    assert plan.meta["schedule_name"] == "transpose(recompute=layers=1)"
    with pytest.raises(SpecError, match=r"^mpipe.recompute: 'full' contradicts the schedule's recompute of 'llm' "
                                        r"\(layers=1\); give it in one place"):
        checked_plan(load_recipe(TINY, ["mpipe.recompute=full", "mpipe.schedule=transpose(recompute=layers=1)"]))


@pytest.mark.parametrize("value,want", [(True, [(2, True), (2, True)]), ([1, 0], [(1, True), (1, False), (2, False)]),
                                        ([0, 2], [(2, False), (2, True)]), (False, [(2, False), (2, False)])])
def test_mindformers_recompute_config_per_stage(value, want):
    from hyperparallel.recipe.recipe import recipe_from_dict
    raw = load_recipe(MF).raw
    raw.setdefault("recompute_config", {})["recompute"] = value
    plan = checked_plan(recipe_from_dict(raw))
    assert [(c.layers, c.recompute) for c in plan.chunks if c.region == plan.chunks[-1].region] == want


@pytest.mark.parametrize("value,words", [
    ([1, 0, 1], "recompute_config.recompute: [1, 0, 1] has 3 entries; MindFormers needs pipeline_stage (2)"),
    ([[0, 1], [0, 0]], "recompute_config.recompute: [[0, 1], [0, 0]] has 2 rows; MindFormers needs "
                       "pp_interleave_num (1)"),
    ([3, 0], "recompute_config.recompute: 3 recomputed layers but chunk 0 has 2; allowed: 0..2"),
    ("often", "recompute_config.recompute: 'often' unknown; allowed: true, false, a list of pipeline_stage (2)"),
])
def test_mindformers_recompute_config_bad_values(value, words):
    from hyperparallel.recipe.recipe import recipe_from_dict
    raw = load_recipe(MF).raw
    raw.setdefault("recompute_config", {})["recompute"] = value
    with pytest.raises(SpecError) as e:
        checked_plan(recipe_from_dict(raw))
    assert str(e.value).startswith(words), str(e.value)


def test_recompute_given_twice_is_refused():
    from hyperparallel.recipe.recipe import recipe_from_dict
    raw = load_recipe(MF).raw
    raw.setdefault("recompute_config", {})["recompute"] = True
    raw.setdefault("mpipe", {})["recompute"] = "full"
    with pytest.raises(SpecError, match=r"^mpipe.recompute: 'full' and recompute_config.recompute: True both given"):
        recipe_from_dict(raw)


def test_recompute_of_a_frozen_model_is_one_line_exit_2_before_launch(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-m", "hyperparallel", "train", TINY, "--set", "mpipe.recompute=full",
                        "--set", "mpipe.profile.regions.0.trainable=false", "--set",
                        "mpipe.profile.regions.1.trainable=false", "--run-dir", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.strip().splitlines() == [
        "error: mpipe.recompute: 'full': 'llm' has no backward (every region is frozen): there is nothing to "
        "recompute; allowed: none"]
    assert not (tmp_path / "run" / "logs").exists()


# -- the runtime's count ------------------------------------------------------------------------------------

def test_held_forwards_count_a_kept_input_as_bytes_not_as_a_held_forward():
    from hyperparallel.runtime.memory import HeldForwards
    h = HeldForwards(["llm"])
    h.keep(("llm", 0, 0), 10)
    h.keep(("llm", 0, 1), 10)
    assert h.record() == {"peak_held": {"llm": 0}, "peak_held_total": 0, "peak_held_bytes": 20}
    h.hold(("llm", 0, 0), 25)    # its R: the input is now part of the held forward's 25
    assert h.bytes == 35 and h.record()["peak_held_bytes"] == 35
    h.release(("llm", 0, 0))
    assert h.bytes == 10 and h.record()["peak_held"] == {"llm": 1}


def test_graph_mode_annotations_refuse_a_recomputed_schedule_naming_the_field():
    from hyperparallel.runtime.annotate import GraphModeUnsupported, graph_pipeline
    plan = derive(_llm_only(4), "1f1b(recompute=layers=1)", 2, 4)
    with pytest.raises(GraphModeUnsupported, match=r"^schedule.llm.recompute: '1f1b\(recompute=layers=1\)' "
                                                   r"recomputes 'llm' in the schedule"):
        graph_pipeline(plan)
    assert graph_pipeline(derive(_llm_only(4), "1f1b", 2, 4)).stages == 2
