"""Sharded optimizer state: ``transpose(optimizer=sharded)`` (issue 23 part 4) and ZeRO over the data-parallel
replicas (issue 37: ``train.zero`` / ``parallel_config.optimizer_shard``): the options, their plans, cost and memory."""
import pytest

from hyperparallel.mpipe import check, derive, parse_profile
from hyperparallel.mpipe.cost import ring_ms, simulate
from hyperparallel.errors import SpecError
from hyperparallel.mpipe.ir import ALLGATHER, ALLREDUCE, DP_GROUP, REDUCESCATTER, WEIGHTS, WGRAD
from hyperparallel.mpipe.profile import LinkProfile
from hyperparallel.recipe import schema, checked_plan, load_recipe

from helpers import recipe

TINY = recipe("tiny_mllm.yaml")


def prof(link=None, trainable=True):
    obj = {"regions": [{"name": "vision", "layers": 2, "trainable": trainable, "param_mb": 40.0, "forward_ms": 1.0,
                        "backward_ms": 1.0},
                       {"name": "llm", "layers": 4, "trainable": True, "param_mb": 5.0, "forward_ms": 1.0,
                        "backward_ms": 1.0}], "optimizer_factor": 2.0}
    if link:
        obj["link"] = link
    return parse_profile(obj)


@pytest.mark.parametrize("P", [2, 4])
def test_each_replica_keeps_one_pth_of_the_encoder_optimizer_state(P):
    plain, sharded = (simulate(derive(prof(), s, P, 8), prof()) for s in ("transpose", "transpose(optimizer=sharded)"))
    for a, b in zip(plain.devices, sharded.devices):
        # 80 MB of encoder parameters: grads stay whole (all-reduced), Adam's 160 MB of state is split P ways
        assert (b.params_mb, b.grads_mb) == (a.params_mb, a.grads_mb)
        assert a.optimizer_mb - b.optimizer_mb == pytest.approx(160.0 * (1 - 1 / P))
        assert a.peak_memory_mb - b.peak_memory_mb == pytest.approx(160.0 * (1 - 1 / P))


def test_the_plan_gathers_the_updated_weights_after_every_reduction():
    plan = derive(prof(), "transpose(optimizer=sharded)", 2, 4, D=2)
    assert check(plan) == []
    for prog in plan.programs.values():
        tail = [(a.kind, a.region, a.tensor, a.group) for a in prog[-3:]]
        assert tail == [(ALLREDUCE, "vision", "wgrad", (0, 1)), (ALLREDUCE, None, "wgrad", "dp"),
                        (ALLGATHER, "vision", WEIGHTS, (0, 1))]
    # the body is the replicated plan's: only the gather is added
    plain = derive(prof(), "transpose", 2, 4, D=2)
    assert {d: p[:-1] for d, p in plan.programs.items()} == plain.programs
    assert plan.meta["schedule_name"] == "transpose(optimizer=sharded)"
    # one device: nothing to gather, nothing split
    one = derive(prof(), "transpose(optimizer=sharded)", 1, 4)
    assert not any(a.kind == ALLGATHER for a in one.programs[0])


def test_the_cost_model_charges_the_gather():
    link = {"latency_ms": 0.1, "bandwidth_gb_s": 1.0}
    plain, sharded = (simulate(derive(prof(link), s, 4, 8), prof(link))
                      for s in ("transpose", "transpose(optimizer=sharded)"))
    gather = ring_ms(ALLGATHER, 4, 80.0, LinkProfile(0.1, 1.0))   # the encoder's 80 MB over 4 replicas
    assert gather > 0
    assert sharded.makespan_ms - plain.makespan_ms == pytest.approx(gather)


def test_list_form_and_recipe_encoder_key():
    rec = load_recipe(TINY, ["mpipe.encoder.optimizer=sharded"])
    plan = checked_plan(rec, "transpose")
    assert plan.meta["schedule_name"] == "transpose(optimizer=sharded)"
    listed = checked_plan(load_recipe(TINY), "[{region: vision, skeleton: transpose, optimizer: sharded}, "
                                             "{region: llm, skeleton: pipe}]")
    assert listed.programs == plan.programs
    # a schedule given on the command line says it explicitly, as for the other encoder keys
    assert checked_plan(rec, "transpose(optimizer=replicated)").meta["schedule_name"] == "transpose"
    with pytest.raises(SpecError, match=r"^mpipe.encoder.optimizer: 'sharded' contradicts mpipe.schedule optimizer="):
        load_recipe(TINY, ["mpipe.encoder.optimizer=sharded", "mpipe.schedule=transpose(optimizer=replicated)"])


@pytest.mark.parametrize("schedule,over,field,words", [
    ("1f1b(optimizer=sharded)", [], "schedule.optimizer", "only the transpose skeleton has an optimizer option"),
    ("zbv(optimizer=sharded)", ["parallel_config.pp_interleave_num=2"], "schedule.optimizer", "zbv keeps each region"),
    ("[{region: vision, skeleton: place, optimizer: sharded}, {region: llm, skeleton: pipe}]", [],
     r"schedule\[0\].optimizer", "place keeps each region"),
    ("[{region: vision, skeleton: transpose}, {region: llm, skeleton: pipe, optimizer: sharded}]", [],
     r"schedule\[1\].optimizer", "pipe keeps each region"),
    ("transpose(optimizer=sharded)", ["mpipe.encoder.trainable=false"], "schedule.vision.optimizer",
     "sharded needs a trainable encoder: 'vision' is frozen"),
    ("transpose(optimizer=sharded, backward=central)", [], "schedule.vision.optimizer", "sharded needs backward=owner"),
    ("transpose(optimizer=half)", [], "schedule.optimizer", "'half' unknown; allowed: replicated, sharded"),
])
def test_bad_optimizer_option_names_the_field(cli, schedule, over, field, words):
    with pytest.raises(SpecError, match=rf"^{field}: .*{words}"):
        checked_plan(load_recipe(TINY, over), schedule)


@pytest.mark.parametrize("command", ["plan", "simulate", "train"])
def test_bad_optimizer_option_is_a_one_line_error_exit_2(cli, command):
    r = cli(command, TINY, "--schedule", "transpose(optimizer=sharded)", "--set", "mpipe.encoder.trainable=false")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: schedule.vision.optimizer: sharded needs a trainable")
    r = cli(command, TINY, "--schedule", "1f1b(optimizer=sharded)")
    assert r.returncode == 2 and r.stderr.strip().startswith("error: schedule.optimizer: 'sharded': only the transpose")


# -- ZeRO over the data-parallel replicas (issue 37 point 3) ------------------------------------------

@pytest.mark.parametrize("schedule", ["1f1b", "transpose"])
def test_zero_plans_reduce_then_gather_over_the_data_parallel_group(schedule):
    plain = derive(prof(), schedule, 2, 4, D=2)
    tails, early = {}, {}
    for zero in (1, 2):
        plan = derive(prof(), schedule, 2, 4, D=2, zero=zero)
        assert check(plan) == []
        for d, prog in plan.programs.items():
            # ZeRO-2 reduce-scatters a region whose gradients are complete on the device right after its last
            # weight-gradient task there (and that task's sends); without those, the body and the replica
            # all-reduces are the plain plan's; the data-parallel reduction of the rest is an all-reduce (ZeRO-1)
            # or a reduce-scatter (ZeRO-2), and every rank's shares are gathered after it
            body = [a for a in prog if not (a.kind == REDUCESCATTER and a.region is not None)]
            assert body[:len(plain.programs[d]) - 1] == plain.programs[d][:-1]
            tails[zero, d] = [(a.kind, a.tensor, a.group) for a in body[len(plain.programs[d]) - 1:]]
            for i, a in enumerate(prog):
                if a.kind == REDUCESCATTER and a.region is not None:
                    assert zero == 2 and a.group == DP_GROUP and a.tensor == WGRAD
                    last = max(j for j, b in enumerate(prog) if b.kind in ("W", "BW") and b.region == a.region)
                    assert i > last and all(b.kind == "SEND" for b in prog[last + 1:i])
                    early.setdefault(d, []).append(a.region)
    for d in plain.programs:
        assert tails[1, d] == [(ALLREDUCE, WGRAD, DP_GROUP), (ALLGATHER, WEIGHTS, DP_GROUP)]
    # 1f1b: the encoder is placed on device 0 and the LLM pipelined: every region's gradients are complete
    # after its last backward there, nothing is left for the tail. transpose: the encoder's replicas are summed
    # over the pipeline devices first, at the tail: its reduce-scatter stays there
    if schedule == "1f1b":
        assert early == {0: ["llm", "vision"], 1: ["llm"]}
        assert all(tails[2, d] == [(ALLGATHER, WEIGHTS, DP_GROUP)] for d in plain.programs)
    else:
        assert early == {0: ["llm"], 1: ["llm"]}
        assert all(tails[2, d] == [(REDUCESCATTER, WGRAD, DP_GROUP), (ALLGATHER, WEIGHTS, DP_GROUP)] and
                   (plain.programs[d][-2].kind, plain.programs[d][-2].region) == (ALLREDUCE, "vision") for d in plain.programs)
    assert plain.programs[0][-1].kind == ALLREDUCE and plain.programs[0][-1].group == DP_GROUP


def test_zero_memory_splits_optimizer_state_and_then_grads_over_the_replicas():
    # transpose, P = 2: each device holds the 80 MB encoder and 10 MB of the LLM; D = 4 replicas of each device
    plain, z1, z2 = (simulate(derive(prof(), "transpose", 2, 4, D=4, zero=z), prof()) for z in (0, 1, 2))
    for a, b, c in zip(plain.devices, z1.devices, z2.devices):
        assert (a.params_mb, a.grads_mb, a.optimizer_mb) == (90.0, 90.0, 180.0)
        assert (b.params_mb, b.grads_mb, b.optimizer_mb) == (90.0, 90.0, 45.0)    # ZeRO-1: Adam's state / 4
        assert (c.params_mb, c.grads_mb, c.optimizer_mb) == (90.0, 22.5, 45.0)    # ZeRO-2: grads / 4 too
        assert a.peak_memory_mb - c.peak_memory_mb == pytest.approx(135.0 + 67.5)


def test_zero_cost_charges_the_gather_and_a_reduce_scatter_is_half_an_all_reduce():
    link = {"latency_ms": 0.1, "bandwidth_gb_s": 1.0}
    plain, z1, z2 = (simulate(derive(prof(link), "1f1b", 2, 4, D=4, zero=z), prof(link)) for z in (0, 1, 2))
    lp = LinkProfile(0.1, 1.0)
    held = max(80.0 + 10.0, 10.0)   # device 0 holds the encoder (placed) and half the LLM: the slower one
    gather = ring_ms(ALLGATHER, 4, held, lp)
    assert gather > 0 and ring_ms(REDUCESCATTER, 4, held, lp) == pytest.approx(gather)
    assert z1.makespan_ms - plain.makespan_ms == pytest.approx(gather)
    # ring all-reduce = reduce-scatter + all-gather: ZeRO-2 moves what the plain plan moves, in one
    # reduce-scatter per region on device 0 (the encoder's and its LLM chunk's, each after its last backward
    # there): one more collective's latency, (D - 1) hops, on the critical device
    rs = [[a.region for a in p if a.kind == REDUCESCATTER] for p in derive(prof(link), "1f1b", 2, 4, D=4,
                                                                             zero=2).programs.values()]
    assert rs == [["llm", "vision"], ["llm"]]
    assert z2.makespan_ms == pytest.approx(plain.makespan_ms + 3 * 0.1)


@pytest.mark.parametrize("over,level", [
    (["train.zero=1"], 1), (["train.zero=2"], 2), (["train.zero=0"], 0),
    (["parallel_config.optimizer_shard=true"], 1), (["parallel_config.optimizer_shard=false"], 0),
    (["parallel_config.optimizer_shard=true", "train.zero=1"], 1), ([], 0)])
def test_recipe_keys_give_the_zero_level(over, level):
    rec = load_recipe(TINY, ["parallel_config.data_parallel=2"] + over)
    assert rec.zero == level
    plan = checked_plan(rec, "transpose")
    kinds = [(a.kind, a.region) for a in plan.programs[0] if a.group == DP_GROUP]
    # ZeRO-2: the LLM's gradients after its last backward, the replicated encoder's after its pipeline all-reduce
    assert kinds == {0: [(ALLREDUCE, None)], 1: [(ALLREDUCE, None), (ALLGATHER, None)],
                     2: [(REDUCESCATTER, "llm"), (REDUCESCATTER, None), (ALLGATHER, None)]}[level]


@pytest.mark.parametrize("over,field,words", [
    (["train.zero=1"], "train.zero", "ZeRO 1 shards over the data-parallel replicas, but "
                                     r"parallel_config.data_parallel is 1 \(a single replica\); allowed with "
                                     r"data_parallel 1: 0 \(or raise data_parallel to 2 or more\)$"),
    (["parallel_config.optimizer_shard=true", "train.zero=1"], "parallel_config.optimizer_shard",
     "ZeRO 1 shards over the data-parallel replicas, .* allowed with data_parallel 1: false"),
    (["parallel_config.data_parallel=2", "train.zero=3"], "train.zero", "3 unknown; allowed: 0, 1, 2"),
    (["parallel_config.data_parallel=2", "train.zero=true"], "train.zero", "True unknown; allowed: 0, 1, 2"),
    (["parallel_config.data_parallel=2", "train.zero=2", "parallel_config.optimizer_shard=true"], "train.zero",
     r"2 contradicts parallel_config.optimizer_shard: true \(which reads as train.zero 1\); give it in one place"),
    (["parallel_config.data_parallel=2", "parallel_config.optimizer_shard=maybe"], "parallel_config.optimizer_shard",
     "must be true or false, got 'maybe'"),
])
def test_bad_zero_settings_name_the_key(over, field, words):
    with pytest.raises(SpecError, match=rf"^{field}: {words}"):
        load_recipe(TINY, over)


def test_mindformers_optimizer_shard_over_one_replica_plans_unsharded_with_a_note_and_train_refuses_it():
    """Public MindFormers configs set ``optimizer_shard: true`` with ``data_parallel: 1`` (MindSpore then shards
    over nothing): the plan holds whole optimizer state and says why; ``train`` refuses the pair before launch."""
    rec = load_recipe(TINY, ["parallel_config.optimizer_shard=true"])
    why = ("parallel_config.optimizer_shard: ZeRO 1 shards over the data-parallel replicas, but "
           "parallel_config.data_parallel is 1 (a single replica); allowed with data_parallel 1: false (or raise "
           "data_parallel to 2 or more)")
    assert rec.zero == 0 and f"note: {why} (train refuses it; the plan holds the whole optimizer state)" in rec.notes
    with pytest.raises(SpecError) as e:
        schema.check_trainable(rec.raw, "CPU")
    assert str(e.value) == why
    assert not load_recipe(TINY, ["parallel_config.optimizer_shard=true", "parallel_config.data_parallel=2"]).notes


def test_zero_and_a_pipeline_sharded_encoder_are_one_or_the_other():
    rec = load_recipe(TINY, ["parallel_config.data_parallel=2", "train.zero=1"])
    with pytest.raises(SpecError, match=r"^schedule.vision.optimizer: sharded shards 'vision' over its pipeline "
                                        r"replicas; ZeRO \(train.zero 1\) shards every region"):
        checked_plan(rec, "transpose(optimizer=sharded)")


@pytest.mark.parametrize("command", ["plan", "train"])
def test_zero_with_one_replica_is_a_one_line_error_exit_2_before_launch(cli, tmp_path, command):
    args = ["--run-dir", str(tmp_path / "run")] if command == "train" else []
    r = cli(command, TINY, "--set", "train.zero=2", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: train.zero: ZeRO 2 shards over the data-parallel "
                                                   "replicas, but parallel_config.data_parallel is 1"), lines
    assert not (tmp_path / "run").exists()


class _Members:
    """The data-parallel group of D members as seen by member ``rank`` (what a Shard asks at construction)."""

    def __init__(self, rank, D):
        self.rank, self.D = rank, D

    def ranks_of(self, group):
        return list(range(self.D))


@pytest.mark.parametrize("D", [2, 3])
def test_runtime_shares_take_the_bytes_the_cost_model_counts_padding_included(D):
    """Odd-sized parameters in MindFormers' two weight-decay groups, in two chunks of one region and one of
    another: every member's flat shares (its grads at ZeRO-2) and AdamW state take exactly the bytes
    ``static_memory`` counts with the runtime's share size (``share_bytes`` per region and group): more than
    1/D of the parameters by the padding of each share."""
    pytest.importorskip("mindformers")
    import numpy as np
    from mindspore import Parameter, Tensor
    from hyperparallel.mpipe.cost import share_bytes, static_memory
    from hyperparallel.recipe.train import TrainConfig
    from hyperparallel.runtime import compat
    from hyperparallel.runtime.memory import nbytes, static_bytes
    from hyperparallel.runtime.sharded import Shard, ShardedOptimizer
    compat.setup_device("CPU")
    cfg = TrainConfig.from_raw({"train": {"seed": 0, "steps": 3}, "optimizer": {
        "type": "AdamW", "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": 0.1}})
    plan = derive(prof(), "gpipe", 1, 2, V=2, D=D, zero=2)
    chunks = sorted({(c.region, c.index) for c in plan.chunks})
    assert chunks == [("llm", 0), ("llm", 1), ("vision", 0)]
    shapes = {("vision", 0): [(3, 5), (5,)], ("llm", 0): [(5, 3), (3,)],
              ("llm", 1): [(2, 5), (7,)]}   # weights (decay) and biases (no decay), odd element counts
    params = {k: [Parameter(Tensor(np.ones(s, np.float32)), name=f"{k[0]}.{k[1]}.{'bias' if len(s) == 1 else 'w'}")
                  for s in v] for k, v in shapes.items()}
    size = {k: sum(int(p.nbytes) for p in v) for k, v in params.items()}
    groups = {k: {0.1: int(v[0].nbytes), 0.0: int(v[1].nbytes)} for k, v in params.items()}
    want = static_memory(plan, lambda r, c: size[(r, c)], 2.0, shard=share_bytes, groups=lambda r, c: groups[(r, c)])
    ideal = static_memory(plan, lambda r, c: size[(r, c)], 2.0)
    for rank in range(D):
        shards = {f"zero.{r}": Shard(f"zero.{r}", [p for k in chunks if k[0] == r for p in params[k]], "dp",
                                     _Members(rank, D), cfg) for r in ("vision", "llm")}
        assert [len(s.shares) for s in shards.values()] == [2, 2]
        opt = ShardedOptimizer([p for v in params.values() for p in v], shards, cfg)
        held = {s.param.name: s.param for sh in shards.values() for s in sh.shares}   # ZeRO-2's slices' shape
        got = static_bytes([p for v in params.values() for p in v], held, opt)
        assert (got["params_bytes"], got["grads_bytes"], got["optimizer_bytes"]) == want[0]
        assert sum(nbytes(p) for p in held.values()) == want[0][1] > ideal[0][1]
        assert want[0][2] - ideal[0][2] == 2.0 * (want[0][1] - ideal[0][1]) > 0
