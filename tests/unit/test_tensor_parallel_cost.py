"""The cost model under T-way tensor parallelism (``parallel_config.model_parallel``) and the real-size recipes'
memory verdicts: exact figures on a hand-checkable profile, the 7B / 72B fit-or-over lines, refused T."""
import pytest

from hyperparallel.mpipe import derive, parse_profile
from hyperparallel.mpipe.cost import simulate, tensor_parallel_profile

from helpers import recipe, run_main

# per layer: forward 2, backward 4, weight 1 ms; 8 MB params, 34 MB activations, 10 MB output.
# tensor_link moves 10 MB in 1 ms with no latency, so a T=2 ring all-reduce of it takes 2(T-1)/T x 1 = 1 ms
LAYER = {"name": "llm", "layers": 4, "trainable": True, "forward_ms": 2.0, "backward_ms": 4.0, "weight_ms": 1.0,
         "activation_mb": 34.0, "output_mb": 10.0, "param_mb": 8.0}
PROFILE = parse_profile({"regions": [LAYER], "tensor_link": {"latency_ms": 0.0, "bandwidth_gb_s": 10000 / 1024}})


def _run(T):
    plan = derive(PROFILE, "1f1b", 2, 4, 1)
    if T > 1:
        plan.meta["tensor_parallel"] = T
    return simulate(plan, PROFILE)


def test_per_rank_profile_by_formula():
    r = tensor_parallel_profile(PROFILE, 2, ("llm",)).region("llm")
    # compute / 2, plus two 1 ms all-reduces forward and two backward; the weight grad has none
    assert (r.forward_ms, r.backward_ms, r.weight_ms) == (2 / 2 + 2.0, 4 / 2 + 2.0, 1 / 2)
    # parameters / 2; activations: 10 of 34 s x h stay whole, 24 split: 10 + 24 / 2 = 22
    assert (r.param_mb, r.activation_mb, r.output_mb) == (4.0, pytest.approx(22.0), 10.0)
    assert tensor_parallel_profile(PROFILE, 1, ("llm",)) is PROFILE


def test_tensor_parallel_halves_params_and_adds_the_all_reduces():
    one, two = _run(1), _run(2)
    # 1F1B: (M + P - 1) x (f + b + w) per 2-layer chunk; T=1: 5 x (4 + 8 + 2) = 70; T=2: 5 x (6 + 8 + 1) = 75
    assert one.makespan_ms == pytest.approx(70.0) and two.makespan_ms == pytest.approx(75.0)
    d1, d2 = one.devices[0], two.devices[0]
    # 2 layers of 8 MB: params, grads 1x, Adam 2x; halved under T=2
    assert (d1.params_mb, d1.grads_mb, d1.optimizer_mb) == (16.0, 16.0, 32.0)
    assert (d2.params_mb, d2.grads_mb, d2.optimizer_mb) == (8.0, 8.0, 16.0)
    # device 0 holds P = 2 micro-batches x 2 layers: 136 MB whole, 2 x 2 x 22 = 88 MB per rank
    assert (d1.peak_activation_mb, d2.peak_activation_mb) == (pytest.approx(136.0), pytest.approx(88.0))


def test_encoder_stays_whole_in_the_group():
    prof = parse_profile({"regions": [dict(LAYER, name="vision", layers=2), LAYER]})
    plan = derive(prof, "1f1b", 2, 4, 1)
    plan.meta["tensor_parallel"] = 2
    split = tensor_parallel_profile(prof, 2, ("llm",))
    assert split.region("vision") == prof.region("vision") and split.region("llm").param_mb == 4.0
    # no tensor_link: the all-reduces ride the pipeline link (free here)
    assert split.region("llm").forward_ms == 1.0


@pytest.mark.parametrize("name,sets,device,verdict", [
    ("qwen2_5_vl_7b.yaml", (), 0, "fits 64 GB"),
    ("qwen2_5_vl_7b.yaml", ("parallel_config.optimizer_shard=false",), 0, "exceeds 64 GB"),
    ("qwen2_5_vl_72b.yaml", (), 1, "fits 64 GB"),
    ("qwen2_5_vl_72b.yaml", ("parallel_config.model_parallel=1", "parallel_config.optimizer_shard=false",
                             "mpipe.recompute=none"), 0, "exceeds 64 GB"),
])
def test_real_size_recipes_fit_with_the_levers_and_not_without(name, sets, device, verdict):
    args = [a for s in sets for a in ("--set", s)]
    r = run_main("plan", recipe(name), *args)
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("memory: "))
    assert f"device {device}'s predicted peak" in line and verdict in line and "(mpipe.memory_limit_gb)" in line
    assert "activations" in line and "parameters" in line and "grads" in line and "optimizer state" in line
    assert ("warning: mpipe.memory_limit_gb" in r.stderr) == (verdict != "fits 64 GB")


def test_72b_parts_by_hand():
    """72B at TP 2: a stage's 10 LLM layers hold 10 x 3349.4 / 2 MB of float32 parameters and as much grads,
    Adam's 2x sharded over D = 8; every device holds the frozen ViT's 32 x 75.5 MB (parameters only)."""
    r = run_main("simulate", recipe("qwen2_5_vl_72b.yaml"), "--json")
    assert r.returncode == 0, r.stderr
    import json
    d = json.loads(r.stdout)["devices"][1]
    llm = 10 * 3349.4 / 2
    assert d["params_mb"] == pytest.approx(llm + 32 * 75.5)
    assert d["grads_mb"] == pytest.approx(llm) and d["optimizer_mb"] == pytest.approx(2 * llm / 8)


@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_tensor_parallel_the_model_cannot_split_refused(command):
    r = run_main(command, recipe("qwen2_5_vl_72b.yaml"), "--set", "parallel_config.model_parallel=3")
    assert r.returncode == 2
    assert ("parallel_config.model_parallel: 3 does not divide model.model_config.num_attention_heads (64); "
            "allowed: 1, 2, 4, 8, 16, 32, 64") in r.stderr


def test_tensor_link_bad_input_refused():
    with pytest.raises(Exception, match=r"mpipe.profile.tensor_link.*latency_ms, bandwidth_gb_s"):
        parse_profile({"regions": [LAYER], "tensor_link": {"speed": 1}})


def test_the_norms_stay_whole_on_every_rank():
    """whole_param_mb (the norms, measured by hyperparallel profile) is held whole; the rest splits: 2 + 6 / 2."""
    prof = parse_profile({"regions": [dict(LAYER, whole_param_mb=2.0)]})
    r = tensor_parallel_profile(prof, 2, ("llm",)).region("llm")
    assert (r.param_mb, r.whole_param_mb) == (5.0, 2.0)
    plan = derive(prof, "1f1b", 2, 4, 1)
    plan.meta["tensor_parallel"] = 2
    d = simulate(plan, prof).devices[0]
    assert (d.params_mb, d.grads_mb, d.optimizer_mb) == (10.0, 10.0, 20.0)   # 2 layers of 5 MB
    with pytest.raises(Exception, match=r"regions\[0\]\.whole_param_mb: 9.0 exceeds param_mb \(8.0\)"):
        parse_profile({"regions": [dict(LAYER, whole_param_mb=9.0)]})


def test_static_memory_takes_each_ranks_share_of_real_bytes():
    """A test's real bytes: the chunk's whole size and its split parts (slices: T, or the key/value heads'
    count); with ZeRO-1 over D = 2 the optimizer state is half of that share."""
    from hyperparallel.mpipe.cost import static_memory, tensor_parallel_share
    assert tensor_parallel_share(100, ((64, 4), (16, 2))) == 100 - 80 + 16 + 8
    # 255 rows of 4 bytes over T = 2: padded to 256, 128 rows a rank
    assert tensor_parallel_share(1020 + 10, ((1020, 2, 255),)) == 10 + 128 * 4
    prof = parse_profile({"regions": [LAYER]})
    plan = derive(prof, "1f1b", 2, 4, 1, D=2, zero=1)
    plan.meta["tensor_parallel"] = 4
    got = static_memory(plan, lambda r, c: 1000, 2.0, split=lambda r, c: ((800, 4), (100, 2)))
    share = 1000 - 900 + 200 + 50
    assert got[0] == (share, share, 2.0 * share / 2)
    plan.meta["tensor_parallel"] = 1   # T = 1: the split is not taken
    assert static_memory(plan, lambda r, c: 1000, 2.0, split=lambda r, c: ((800, 4),))[0] == (1000, 1000, 1000)


def test_a_measured_profile_records_the_part_tensor_parallelism_keeps_whole():
    """hyperparallel profile: per region with split weights, its chunks' whole part (measure.py: the bytes of the
    parameters the adapter's ``tensor_parallel_split`` does not name) over its layers; none for other regions."""
    from fake_bench import profile_rank
    from hyperparallel.bench.profile import build_profile
    from hyperparallel.recipe import derive_recipe, load_recipe
    rec = load_recipe(recipe("tiny_mllm.yaml"))
    plan = derive_recipe(rec)
    rank = dict(profile_rank(), whole_param_mb={"llm/0": 0.02, "llm/1": 0.04})
    regions = {r["name"]: r for r in build_profile(rec, plan, [rank])["regions"]}
    L = rec.profile.region("llm").layers
    assert regions["llm"]["whole_param_mb"] == round(0.06 / L, 5) and "whole_param_mb" not in regions["vision"]
    assert "whole_param_mb" not in {k for r in build_profile(rec, plan, [profile_rank()])["regions"] for k in r}
