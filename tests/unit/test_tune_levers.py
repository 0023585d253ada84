"""``tune --memory-limit``: T and recompute in the search space, bounds that stay bounds with them (and with
ZeRO), and the search finding a recompute or T > 1 plan where nothing else fits."""
import json

import pytest

from helpers import recipe, run_main
from hyperparallel.recipe import load_recipe
from hyperparallel.tune.bound import body_bound, memory_bound, time_bound
from hyperparallel.tune.search import evaluate, search
from hyperparallel.tune.space import Space


@pytest.mark.parametrize("sets", [[], ["parallel_config.data_parallel=2", "train.zero=1"],
                                  ["parallel_config.data_parallel=2", "train.zero=2"]])
def test_bounds_hold_with_tensor_parallel_recompute_and_zero(sets):
    sp = Space(load_recipe(recipe("mllm_frozen_vit.yaml"), sets), tensor_parallel=(1, 2),
               recompute=(None, "full"))
    assert sp.describe()["T"] == [1, 2] and sp.describe()["recompute"] == ["recipe", "full"]
    n, bodies = 0, {}
    for c in sp.candidates():
        if c.V > 1 or c.M not in (2, 4):   # a slice of the space: both levers, every order at V = 1
            continue
        s = evaluate(sp, c)
        assert time_bound(sp, c) <= s.step_ms + 1e-6, c
        if not c.spill:
            assert body_bound(sp, c, bodies) <= s.step_ms + 1e-6, c
        assert all(b <= p + 1e-6 for b, p in zip(memory_bound(sp, c), s.peaks_mb)), c
        n += 1
    assert n > 50


def test_tight_limit_finds_a_recompute_plan():
    """tiny_mllm: nothing without recompute fits 1.5 MB (1000 MB to the GB); rank 1 recomputes."""
    r = run_main("tune", recipe("tiny_mllm.yaml"), "--memory-limit", "0.0015", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["candidates"][0]["recompute"] == "full" and "recompute=full" in out["candidates"][0]["schedule"]
    assert all(c["peak_mb"] <= 1.5 for c in out["candidates"])
    # without the levers (no --memory-limit) the recipe's own recompute alone is searched
    sp = Space(load_recipe(recipe("tiny_mllm.yaml")))
    assert {c.recompute for c in sp.candidates()} == {None} and sp.Ts == [1]


def test_tight_limit_on_the_7b_recipe_finds_tensor_parallel():
    """Qwen2.5-VL-7B at P = 2, D = 4, ZeRO-1: under 40 GB (1000 MB to the GB) only T > 1 fits; the T values
    searched are those the adapter allows (28 heads, 4 key/value heads, 18944 channels, 152064 vocabulary)."""
    from hyperparallel.commands.tune import levers
    rec = load_recipe(recipe("qwen2_5_vl_7b.yaml"))
    ts, recs = levers(rec)
    assert ts == (1, 2, 4) and recs == (None, "full")
    sp = Space(rec, max_v=1, tensor_parallel=ts, recompute=recs)
    out = search(sp, 40000.0, top=3, refine=0)
    assert out.ranked and all(s.cand.T > 1 and s.peak_mb <= 40000.0 for s in out.ranked)
