"""``hyperparallel tune``: the search space, the bounds, the pruned search against the exhaustive one,
the ranked table, the overlay that plan/simulate read as is, bad input."""
import json
import os

import numpy as np
import pytest
import yaml

from helpers import recipe
from hyperparallel.mpipe.profile import parse_profile
from hyperparallel.recipe import load_recipe
from hyperparallel.recipe.mindformers import layer_layout, offset_of
from hyperparallel.tune.bound import body_bound, memory_bound, time_bound
from hyperparallel.tune.search import evaluate, search
from hyperparallel.tune.space import Candidate, Encoder, Space, profile_at_size


# -- the space ----------------------------------------------------------------------------------

def test_space_of_a_frozen_encoder_recipe_and_its_batch_keys():
    # bench_encoder_heavy: P=2, M=4 x data.micro_batch_size 4 = 16 samples, 2 LLM layers (V=1 only)
    sp = Space(load_recipe(recipe("bench_encoder_heavy.yaml")))
    d = sp.describe()
    assert d["V"] == [1] and d["M"] == [1, 2, 4, 8, 16]
    # interleaved_zb_fast: issue 23's pre-lean order, searched too (at V=1 it ties with interleaved_zb)
    assert d["orders_by_V"] == {"1": ["gpipe", "1f1b", "zb_h1", "interleaved_zb", "interleaved_zb_fast"]}
    # frozen encoder: place on device 0 (the 1F1B-style baseline) + 3 owner policies x 2 spills
    assert d["encoders"][0] == "place(device=0)" and len(d["encoders"]) == 7
    assert all("backward=owner" in e for e in d["encoders"][1:])
    assert d["families"] == 5 * 5 * 7 == d["base_candidates"]   # one split (1, 1) per family
    assert sp.batch.samples == 16 and sp.batch.sizes(8) == {"data.micro_batch_size": 2}
    assert sp.batch.sizes(3) is None


def test_mindformers_batch_keys_and_trained_encoder_options():
    sp = Space(load_recipe(recipe("mf_llama_mllm_bench.yaml")))
    assert sp.batch.sizes(16) == {"data.micro_batch_size": 1, "model.model_config.batch_size": 1}
    tr = Space(load_recipe(recipe("mllm_frozen_vit.yaml"), ["mpipe.profile.regions.0.trainable=true"]))
    # trained encoder: backward owner / central instead of spill
    assert [e for e in tr.describe()["encoders"] if "central" in e] == [
        f"transpose(owners={o}, backward=central, spill=none)" for o in ("round_robin", "min", "balanced")]


def test_offset_round_trips_mindformers_layout_including_zbv():
    for layers, P, V, zbv in (((3, 1), 2, 1, False), ((2, 1, 1, 3), 2, 2, False), ((2, 1, 1, 3), 2, 2, True),
                              ((2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1), 8, 2, False)):
        off = offset_of(layers, P, V, zbv=zbv)
        assert layer_layout(sum(layers), off, P, V, zbv=zbv) == layers
    assert offset_of((2, 1, 1, 3), 2, 2, zbv=True) == [[1, 0], [2, 0]]   # base 7 // 4 = 1; second row reversed
    assert offset_of((2, 2), 2, 1) == 0


def test_profile_at_another_micro_batch_size():
    def prof(size, f):
        return parse_profile({"micro_batch_size": size, "regions": [
            {"name": "llm", "layers": 2, "trainable": True, "forward_ms": f, "backward_ms": 2 * f, "weight_ms": f,
             "activation_mb": f, "output_mb": 1.0, "param_mb": 5.0}]})
    one = {4: prof(4, 8.0)}
    assert profile_at_size(one, 1).regions[0].forward_ms == 2.0          # one size: proportional
    assert profile_at_size(one, 1).regions[0].param_mb == 5.0            # parameters do not scale
    two = {1: prof(1, 3.0), 4: prof(4, 9.0)}
    assert profile_at_size(two, 4).regions[0].forward_ms == 9.0          # exact at a measured size
    assert profile_at_size(two, 2).regions[0].forward_ms == 5.0          # linear between: 3 + (9 - 3) / 3
    assert profile_at_size(two, 8).regions[0].forward_ms == 17.0         # along the nearest segment beyond
    assert profile_at_size(two, 2).micro_batch_size == 2


# -- bounds and search --------------------------------------------------------------------------

@pytest.mark.parametrize("name,sets", [("mllm_frozen_vit.yaml", []),
                                       ("mllm_frozen_vit.yaml", ["mpipe.profile.regions.0.trainable=true"]),
                                       ("bench_encoder_heavy.profile.yaml", []), ("llm_pipeline.yaml", [])])
@pytest.mark.slow
def test_bounds_never_exceed_what_the_cost_model_reports(name, sets):
    sp = Space(load_recipe(recipe(name), sets))
    n, bodies = 0, {}
    for c in sp.candidates():
        s = evaluate(sp, c)
        assert time_bound(sp, c) <= s.step_ms + 1e-6, c
        if not c.spill:   # the LLM alone, free communication: never slower than the whole plan
            assert body_bound(sp, c, bodies) <= s.step_ms + 1e-6, c
        assert all(b <= p + 1e-6 for b, p in zip(memory_bound(sp, c), s.peaks_mb)), c
        n += 1
    assert n == sp.size()


def test_pruned_search_finds_the_exhaustive_table_deriving_less():
    sp = Space(load_recipe(recipe("mllm_frozen_vit.yaml")))
    full = search(sp, top=5, prune=False, refine=0)
    fast = search(sp, top=5, prune=True, refine=0)
    assert full.counts["derived"] == sp.size() == 231
    assert fast.counts["derived"] <= full.counts["derived"] / 2
    assert fast.counts["searched"] == fast.counts["derived"] + fast.counts["time_bound"] == 231
    assert [(s.name, s.cand.V, s.cand.M, s.step_ms) for s in fast.table] == \
        [(s.name, s.cand.V, s.cand.M, s.step_ms) for s in full.table]
    # one row per family (everything but the layer split)
    assert len({s.cand.family for s in fast.table}) == 5


def test_spellings_of_one_plan_are_one_candidate_named_once():
    # bench_encoder_heavy at V=1: zb_h1 and interleaved_zb derive the same programs (and, at some M,
    # interleaved_zb_fast and owners min too); the table holds distinct plans, the others are its aliases
    sp = Space(load_recipe(recipe("bench_encoder_heavy.yaml")))
    out = search(sp, top=5, refine=0)
    assert out.counts["same_plan"] > 0 and out.counts["kept"] + out.counts["same_plan"] == out.counts["derived"]
    prints = [s.fingerprint for s in out.ranked]
    assert len(set(prints)) == len(prints)   # every kept candidate is another plan
    first = next(s for s in out.table if s.same_plan)
    from hyperparallel.recipe.recipe import checked_plan
    rec = sp.recipe_for(first.cand)
    plans = [checked_plan(rec, name).to_json() for name in [first.name] + first.same_plan]
    assert all(p["programs"] == plans[0]["programs"] and p["chunks"] == plans[0]["chunks"] for p in plans)
    # the kept spelling is the best-ranked one: the shortest
    assert all(len(first.name) <= len(n) for n in first.same_plan)
    # a spelling that places the encoder differently is another plan, kept on its own
    assert first.name.startswith("transpose(") and "owners" not in first.name, first.name
    other = first.name.replace("transpose(", "transpose(owners=balanced, ")
    assert checked_plan(rec, other).to_json()["programs"] != plans[0]["programs"]
    assert other not in first.same_plan
    # the exhaustive search collapses the same way and agrees
    full = search(sp, top=5, prune=False, refine=0)
    assert [(s.name, s.same_plan) for s in full.table] == [(s.name, s.same_plan) for s in out.table]


@pytest.mark.slow
def test_memory_limit_drops_candidates_and_every_kept_one_fits():
    sp = Space(load_recipe(recipe("paper_8dev_qwen_vit.yaml")))
    out = search(sp, limit_mb=100_000, top=3, refine=0)
    assert out.counts["memory_bound"] + out.counts["memory"] > 0
    assert all(s.peak_mb <= 100_000 for s in out.ranked)


def test_uneven_split_becomes_mindformers_offset_and_the_recipe_keys():
    sp = Space(load_recipe(recipe("mf_llama_mllm.yaml")))
    c = Candidate("zbv", 2, sp.M0, Encoder("transpose"), (1, 1, 1, 1), "even")
    # mf_llama_mllm: 4 LLM layers, P=2; one layer per chunk at V=2
    assert sp.offset(c) == 0
    assert sp.recipe_for(c).chunk_layers("zbv") == (1, 1, 1, 1)
    assert sp.keys(c)["parallel"]["pipeline_config"] == {"pipeline_interleave": True,
                                                         "pipeline_scheduler": "zero_bubble_v"}
    c = Candidate("1f1b", 1, sp.M0, Encoder("transpose"), (3, 1), "moved")
    keys = sp.keys(c)
    assert keys["model"]["model_config"]["offset"] == [1, -1]
    assert sp.recipe_for(c).chunk_layers("1f1b") == (3, 1)


# -- the command --------------------------------------------------------------------------------

def _json(cli, *args):
    r = cli("tune", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_json_ranks_candidates_at_least_as_fast_as_every_named_schedule(cli):
    d = _json(cli, recipe("mllm_frozen_vit.yaml"), "--top", "3")
    c = d["counts"]
    assert c["searched"] == 231 and c["searched"] == c["derived"] + c["time_bound"] + c["memory_bound"]
    assert c["kept"] + c["same_plan"] == c["derived"] and c["refused"] == 0
    steps = [x["step_ms"] for x in d["candidates"]]
    assert len(steps) == 3 and steps == sorted(steps)
    first = d["candidates"][0]
    assert first["schedule"] == "transpose(owners=balanced, order=dualpipev)"
    assert (first["V"], first["M"], first["micro_batch_size"], first["offset"]) == (2, 8, 1, 0)
    assert first["step_ms"] == pytest.approx(57.264375)
    assert first["peak_memory_mb"] == [418.0] * 4 and first["peak_device"] == 0
    sim = json.loads(cli("simulate", recipe("mllm_frozen_vit.yaml"), "--schedule", "1f1b", "--schedule", "transpose",
                         "--schedule", "transpose(owners=balanced)", "--schedule", "transpose(spill=next_step)",
                         "--json").stdout)
    assert all(first["step_ms"] <= s["makespan_ms"] for s in sim)
    assert d["recipe_schedule"]["schedule"] == "transpose(owners=balanced, spill=next_step)"
    assert d["recipe_schedule"]["step_ms"] == pytest.approx(67.41)


def test_table_counts_offset_and_overlay_that_simulate_and_plan_read_as_is(cli, tmp_path):
    out = str(tmp_path / "tuned.yaml")
    r = cli("tune", recipe("bench_encoder_heavy.profile.yaml"), "--top", "2", "--out", out)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("tune ") and "= micro_batch_num 4 x micro-batch size 4" in lines[0]
    assert "data.micro_batch_size=4; at M the keys become 16 / M" in lines[0]
    assert lines[2].startswith("searched 175: derived ")
    row = next(ln for ln in lines if ln.startswith("1 "))
    assert row.split()[1] == "transpose(spill=next_step," and "368.59" in row
    assert "rank 1's layer split as MindFormers' offset: model.model_config.offset: 0" in lines
    assert lines[-1] == f"wrote {out}"
    with open(out) as f:
        text = f.read()
    over = yaml.safe_load(text)
    assert over["base_config"] == os.path.relpath(recipe("bench_encoder_heavy.profile.yaml"), str(tmp_path))
    assert over["mpipe"]["schedule"] == "transpose(spill=next_step, order=interleaved_zb_fast)"
    assert over["parallel_config"] == {"micro_batch_num": 4, "pp_interleave_num": 1}
    assert over["data"] == {"micro_batch_size": 4}
    assert "# predicted step 368.59 ms" in text
    sim = cli("simulate", out, "--json")
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["makespan_ms"] == pytest.approx(368.59, abs=0.005)
    assert cli("plan", out).returncode == 0


def test_overlay_at_another_micro_batch_count_keeps_the_global_batch(cli, tmp_path):
    out = str(tmp_path / "tuned.yaml")
    d = _json(cli, recipe("bench_encoder_heavy.yaml"), "--top", "1", "--out", out)
    first = d["candidates"][0]
    assert (first["M"], first["micro_batch_size"]) == (16, 1)
    assert first["batch_keys"] == {"data.micro_batch_size": 1}
    rec = load_recipe(out)
    assert rec.micro_batch_num * rec.raw["data"]["micro_batch_size"] == 16
    assert rec.profile.micro_batch_size == 1
    assert rec.profile.regions[0].forward_ms == pytest.approx(13.6741 / 4)   # one size known: proportional
    sim = json.loads(cli("simulate", out, "--json").stdout)
    assert sim["makespan_ms"] == pytest.approx(first["step_ms"], abs=1e-6)


def test_unknown_set_key_is_refused_and_nothing_is_written(cli, tmp_path):
    out = tmp_path / "tuned.yaml"
    r = cli("tune", recipe("mllm_frozen_vit.yaml"), "--set", "parallel_config.micro_batch_nmu=3", "--out", str(out))
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: --set parallel_config.micro_batch_nmu: unknown key: parallel_config has no "
                                "'micro_batch_nmu' (it has: data_parallel, model_parallel, pipeline_stage, "
                                "micro_batch_num, pp_interleave_num)")
    assert not out.exists()


def test_a_memory_limit_no_candidate_meets_names_the_smallest_peak(cli, tmp_path):
    out = tmp_path / "tuned.yaml"
    r = cli("tune", recipe("mllm_frozen_vit.yaml"), "--memory-limit", "0.1", "--out", str(out))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith("error: --memory-limit: no candidate fits 0.1 GB; the smallest predicted peak is "
                               "416.00 MB on device 0 (")
    assert not out.exists()


def test_a_model_that_cannot_be_planned_is_refused(cli):
    r = cli("tune", recipe("mllm_frozen_vit.yaml"), "--set", "parallel_config.pipeline_stage=16")
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: mpipe.profile.regions[1].layers: 'llm' has 8 layers, cannot cut into "
                                "pipeline_stage = 16 chunks: the model cannot be planned on these devices")


@pytest.mark.parametrize("flag,value,msg", [("--top", "0", "error: --top: must be a whole number >= 1, got 0"),
                                            ("--memory-limit", "-1", "error: --memory-limit: must be a number of GB "
                                                                     "> 0, got -1.0"),
                                            ("--out", "x.json", "error: --out: must name a .yaml file, got 'x.json'")])
def test_bad_flags(cli, flag, value, msg):
    r = cli("tune", recipe("mllm_frozen_vit.yaml"), flag, value)
    assert r.returncode == 2 and r.stderr.strip() == msg


def test_llm_alone_bound_is_the_closed_form_for_a_plain_llm():
    # llm_pipeline: P=4, 8 layers of 1+1+1 ms, free communication: 1F1B at M=8 takes (M + P - 1) x 6 ms
    sp = Space(load_recipe(recipe("llm_pipeline.yaml")))
    c = Candidate("1f1b", 1, 8, None, (2, 2, 2, 2))
    assert body_bound(sp, c, {}) == pytest.approx(66.0) == evaluate(sp, c).step_ms


def test_verify_runs_the_cases_in_one_launch_and_compares_the_orders(tmp_path):
    """--verify with a stand-in launcher: one rotation job (top N, the recipe's own schedule, 1F1B, each its
    own recipe and plan); the summary sets measured against predicted order."""
    from types import SimpleNamespace

    from hyperparallel.bench.verify import format_verify, verify
    from hyperparallel.launch import LaunchResult
    from hyperparallel.runconfig import load_parsed
    sp = Space(load_parsed(recipe("bench_encoder_heavy.profile.yaml")))   # as commands/tune loads it
    out = search(sp, top=2)
    measured = iter([400.0, 390.0, 420.0, 600.0])   # ms per case, in case order
    seen = {}

    def launcher(job, world, log_dir, timeout_s, echo, script):
        seen.update(job=job, world=world)
        for case in job["cases"]:
            os.makedirs(case["out_dir"])
            t = next(measured) / 1e3
            for r in range(world):
                steps = [{"step": k, "step_s": t, "foreign_cpu_s": 0.0} for k in range(case["steps"])]
                with open(os.path.join(case["out_dir"], f"rank_{r}.json"), "w") as f:
                    json.dump({"rank": r, "steps": steps}, f)
        return LaunchResult(0, log_dir)

    args = SimpleNamespace(recipe=recipe("bench_encoder_heavy.profile.yaml"), run_dir=str(tmp_path), warmup=1,
                           steps=3, timeout=60)
    code, v = verify(args, sp, out, 2, launcher=launcher)
    assert code == 0 and seen["world"] == 2 and seen["job"]["mode"] == "rotation"
    cases = seen["job"]["cases"]
    assert [c["schedule"] for c in cases] == [out.table[0].name, out.table[1].name, "transpose", "1f1b"]
    assert [c["raw"]["parallel_config"]["micro_batch_num"] for c in cases] == [4, 4, 4, 4]
    assert all(c["steps"] == 4 for c in cases)
    assert [r["measured_order"] for r in v["cases"]] == [2, 1, 3, 4]
    assert [r["predicted_order"] for r in v["cases"]] == [1, 2, 3, 4]
    assert v["first_vs_fastest"] == pytest.approx(400 / 390 - 1)
    assert v["first_within_5pct"] and v["first_faster_than_1f1b"]
    assert v["first_vs_1f1b"] == pytest.approx(1.5)
    assert "within 5%; 1.50x over 1F1B" in format_verify(v)


def test_the_stored_8_device_search_is_what_the_search_finds_today():
    """docs/results.md's table is rendered from docs/tune_paper_8dev.json (tools/tune_paper.py --write): it must be
    what the code finds now; rank 1 is faster than every schedule docs/results.md names for the recipe."""
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    with open(os.path.join(root, "docs", "tune_paper_8dev.json")) as f:
        stored = json.load(f)
    sp = Space(load_recipe(recipe("paper_8dev_qwen_vit.yaml")))
    out = search(sp, top=stored["top"])
    assert [(s.name, s.cand.V, s.cand.M, list(s.cand.layers), round(s.step_ms, 6)) for s in out.table] == \
        [(c["schedule"], c["V"], c["M"], c["layers"], c["step_ms"]) for c in stored["candidates"]]
    from hyperparallel.mpipe.cost import simulate
    from hyperparallel.recipe import checked_plan
    for name in ("1f1b", "transpose", "transpose(owners=balanced)"):
        assert out.table[0].step_ms <= simulate(checked_plan(sp.recipe, name), sp.recipe.profile).step_ms


def test_a_profile_at_the_recipes_own_size_predicts_the_recipe_and_1f1b_cases_too():
    """The verify cases of the recipe's own schedule and 1F1B are predicted with the profile ``tune`` uses at
    the recipe's micro-batch size: a ``--profile`` measured there replaces the recipe's embedded one (it did
    not: the candidates and the recipe's cases were predicted from different profiles)."""
    from hyperparallel.bench.verify import cases
    from hyperparallel.mpipe.cost import simulate
    from hyperparallel.recipe import checked_plan
    from hyperparallel.commands.tune import own_schedule, profiles
    stem = os.path.join(os.path.dirname(recipe("bench_encoder_heavy.yaml")), "profiles", "bench_encoder_heavy")
    files = profiles([f"{stem}.mbs{s}.profile.yaml" for s in (2, 4, 8)])
    rec = load_recipe(recipe("bench_encoder_heavy.yaml"))
    measured4 = next(p for p in files.values() if p.micro_batch_size == 4)
    sp = Space(rec, profiles=files)
    rows = cases(sp, search(sp, top=1), 1)
    want = {s: simulate(checked_plan(rec, s), measured4).step_ms for s in ("transpose", "1f1b")}
    assert want["transpose"] != pytest.approx(simulate(checked_plan(rec, "transpose"), rec.profile).step_ms)
    assert [r["predicted_ms"] for r in rows[1:]] == [pytest.approx(want["transpose"]), pytest.approx(want["1f1b"])]
    assert own_schedule(sp)["step_ms"] == pytest.approx(want["transpose"])


@pytest.mark.msrun
def test_overlay_trains_as_is_on_two_ranks_like_its_reference(cli, tmp_path):
    """The overlay ``--out`` writes trains with ``hyperparallel train`` unchanged: its schedule on the recipe's
    2 ranks, its losses equal to the single-process reference of the overlay."""
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    from helpers import reference_run
    out = str(tmp_path / "tuned.yaml")
    d = _json(cli, recipe("bench_encoder_heavy.yaml"), "--top", "1", "--out", out)
    first = d["candidates"][0]
    from helpers import run_cli   # train launches ranks: a subprocess, as users run it
    r = run_cli("train", out, "--steps", "2", "--run-dir", str(tmp_path / "run"), "--set",
                "train.optimizer_compile=eager", "--compile", "eager", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"schedule {first['schedule']}, P=2 D=1 M={first['M']}" in r.stdout, r.stdout[:500]
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        got = [json.loads(line)["loss"] for line in f]
    np.testing.assert_allclose(got, reference_run(load_recipe(out), 2)[0], rtol=1e-5)
    # (not compared with the tuned-from recipe's losses: synthetic data draws each micro-batch from
    # (seed, step, micro), so another M trains on other samples; a data set is read by sample index)


def test_out_is_checked_before_the_search_and_leaves_no_temporary_file(cli, tmp_path):
    """``tune --out`` onto a folder failed after the search naming ``OUT.tmp`` and left it behind; now
    refused first naming --out, as are a missing folder and the recipe itself; a written overlay
    leaves nothing beside it."""
    own = tmp_path / "frozen.yaml"
    own.write_text(open(recipe("mllm_frozen_vit.yaml")).read())
    (tmp_path / "adir.yaml").mkdir()
    for out, part in ((tmp_path / "adir.yaml", "is a directory; give a file name"),
                      (tmp_path / "nodir" / "t.yaml", "does not exist; create it first"),
                      (own, f"is the input {own}")):
        r = cli("tune", str(own), "--out", str(out))
        assert r.returncode == 2 and r.stderr.startswith("error: --out: ") and part in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1 and ".tmp" not in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["adir.yaml", "frozen.yaml"]
    r = cli("tune", str(own), "--out", str(tmp_path / "t.yaml"))
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["adir.yaml", "frozen.yaml", "t.yaml"]   # no .tmp beside it


def test_write_text_leaves_the_old_file_and_no_temporary_one_when_it_fails(tmp_path):
    from hyperparallel.util import write_text
    write_text(str(tmp_path / "a.txt"), "one")
    os.chmod(tmp_path / "a.txt", 0o640)
    write_text(str(tmp_path / "a.txt"), "two")
    assert (tmp_path / "a.txt").read_text() == "two"
    assert oct(os.stat(tmp_path / "a.txt").st_mode & 0o777) == oct(0o666 & ~_umask())   # as open() makes it
    (tmp_path / "d").mkdir()
    with pytest.raises(OSError):
        write_text(str(tmp_path / "d"), "x")   # a folder in the way: the rename fails
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "d"] and not os.listdir(tmp_path / "d")


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def _spread_profile(tmp_path, spread: float, name: str) -> str:
    """mllm_frozen_vit's own profile (at its micro-batch size 1) as a ``--profile`` file whose llm costs record
    ``spread`` over 5 repeats (the vision region's a larger one, but on a cost too small to count)."""
    prof = dict(load_recipe(recipe("mllm_frozen_vit.yaml")).raw["mpipe"]["profile"], micro_batch_size=1, repeats=5)
    vision, llm = (dict(r) for r in prof["regions"])
    llm["spread"] = {"forward_ms": spread / 2, "backward_ms": spread, "weight_ms": spread / 3}
    vision["spread"] = {"forward_ms": 0.02}
    vision["weight_ms"], vision["spread"]["weight_ms"] = 0.1, 0.9   # < 10% of the region's time: left out
    prof["regions"] = [vision, llm]
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"mpipe": {"profile": prof}}))
    return str(path)


def test_tune_reports_the_profiles_spread_and_a_margin_inside_it(cli, tmp_path):
    """A measured profile's spread over its repeats is printed, and when rank 1's predicted margin over the
    recipe's own schedule is smaller than it, a line says so (a pick inside the profile's noise once measured
    10.8% slower than the recipe's transpose); the JSON gains ``profile_spread``, ``margin``, ``within_noise``."""
    from hyperparallel.commands.tune import NOISE_HINT
    noisy = _spread_profile(tmp_path, 0.3, "noisy.profile.yaml")
    d = _json(cli, recipe("mllm_frozen_vit.yaml"), "--top", "3", "--profile", noisy)
    assert d["candidates"][0]["step_ms"] == pytest.approx(57.264375)   # the same costs: the same pick
    assert d["profile_spread"] == {"spread": 0.3, "cost": "llm.backward_ms", "profile": noisy, "repeats": 5}
    margin = (67.41 - 57.264375) / 57.264375
    assert d["margin"]["over"] == "recipe_schedule" and d["margin"]["margin"] == pytest.approx(margin, abs=1e-6)
    assert d["within_noise"] is True
    r = cli("tune", recipe("mllm_frozen_vit.yaml"), "--top", "3", "--profile", noisy)
    assert r.returncode == 0, r.stderr
    assert f"profile spread over 5 repeats: up to 30.0% (llm.backward_ms, {noisy} profile" in r.stdout
    assert (f"rank 1's predicted margin over the recipe's own schedule is {margin:.1%}, smaller than the profile's "
            f"spread 30.0%: {NOISE_HINT}") in r.stdout
    quiet = _spread_profile(tmp_path, 0.05, "quiet.profile.yaml")
    r = cli("tune", recipe("mllm_frozen_vit.yaml"), "--top", "3", "--profile", quiet)
    assert "profile spread over 5 repeats: up to 5.0% (llm.backward_ms" in r.stdout and NOISE_HINT not in r.stdout
    d = _json(cli, recipe("mllm_frozen_vit.yaml"), "--top", "3")   # a hand-written profile: no spread
    assert d["profile_spread"] is None and d["within_noise"] is None and d["margin"]["over"] == "recipe_schedule"
    r = cli("tune", recipe("mllm_frozen_vit.yaml"), "--top", "3")
    assert "profile spread" not in r.stdout and NOISE_HINT not in r.stdout


def test_a_profile_spread_is_checked():
    """``spread`` takes the time costs only, each a number >= 0; ``repeats`` a whole number >= 1."""
    from hyperparallel.errors import SpecError
    base = {"regions": [{"name": "llm", "layers": 2, "spread": {"forward_ms": 0.1}}]}
    assert parse_profile(base).regions[0].spread == (("forward_ms", 0.1),)
    for bad, msg in (({"activation_mb": 0.1}, "unknown key"), ({"forward_ms": -1}, "must be a number >= 0, got -1"),
                     ([0.1], "must be a mapping of forward_ms")):
        with pytest.raises(SpecError, match=msg) as e:
            parse_profile({"regions": [{"name": "llm", "layers": 2, "spread": bad}]})
        assert "mpipe.profile.regions[0].spread" in str(e.value)
    with pytest.raises(SpecError, match="mpipe.profile.repeats"):
        parse_profile(dict(base, repeats=0))
