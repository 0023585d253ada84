"""``transpose(optimizer=sharded)`` (issue 23 part 4): the schedule option, its plan, its cost and memory."""
import pytest

from hyperparallel.mpipe import check, derive, parse_profile
from hyperparallel.mpipe.cost import ring_ms, simulate
from hyperparallel.errors import SpecError
from hyperparallel.mpipe.ir import ALLGATHER, ALLREDUCE, WEIGHTS
from hyperparallel.mpipe.profile import LinkProfile
from hyperparallel.recipe import checked_plan, load_recipe

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



def test_train_refuses_sharding_an_optimizer_the_flat_shard_does_not_reproduce(cli, tmp_path):
    # MindFormers' AdamW groups parameters (no weight decay for biases and 1-D ones): a flat shard cannot
    r = cli("train", recipe("mf_llama_adamw.yaml"), "--schedule", "transpose(optimizer=sharded)",
            "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1] == ("error: schedule.optimizer: sharded (vision) needs the train: section's adam or sgd without "
                         "weight decay (a flat shard treats every element alike), not MindFormers' AdamW (weight-decay "
                         "groups); use optimizer=replicated"), lines
    assert not (tmp_path / "run").exists()
