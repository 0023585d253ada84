"""The lowering of a derivation is a fixed list of named passes (``hyperparallel.mpipe.lowering``): each fills
in its own fields of the state and changes nothing it was given, and running them is what ``derive`` does."""
import copy
from dataclasses import fields, replace

import pytest

from helpers import mllm, profile
from hyperparallel.mpipe import derive
from hyperparallel.mpipe import lowering
from hyperparallel.mpipe.derive import _Derivation
from hyperparallel.mpipe.profile import TiedWeight
from hyperparallel.mpipe.schedule import parse_schedule

# the fields each pass adds, in pass order
ADDS = {"locate": {"loc"}, "edges": {"messages"}, "fifo_receives": {"trailing", "recvs_at", "sends_after"},
        "collectives": {"head", "tail"}, "assemble": {"programs"}}

TIED = replace(profile(("vision", 2, True), ("llm", 8, True)),
               tied=(TiedWeight("word_embeddings", "llm", (0, 7), 4.0),))
CASES = [  # (profile, schedule, P, M, V, D): every pass has work in at least one case
    (TIED, "transpose", 4, 8, 1, 1),
    (TIED, "interleaved", 2, 4, 2, 2),
    (mllm(False), "transpose(spill=next_step)", 4, 8, 1, 1),
    (mllm(True), "transpose(backward=central)", 2, 4, 1, 1),
    (mllm(True), "transpose(optimizer=sharded)", 4, 8, 1, 2),
    (mllm(True), "transpose(order=zbv)", 2, 4, 2, 1),
]


def test_the_pass_list_is_named_and_ordered():
    assert [p.__name__ for p in lowering.PASSES] == list(ADDS)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[1]}-P{c[2]}V{c[4]}D{c[5]}")
def test_each_pass_adds_its_fields_only_and_leaves_its_input_unchanged(case):
    prof, spelling, P, M, V, D = case
    dv = _Derivation(prof, parse_schedule(spelling, prof, V=V), P, M, V, D)
    facts = dv.lowering_facts()
    state = lowering.Lowering(seqs=dv.compute_order())
    for step in lowering.PASSES:
        before, facts_before = copy.deepcopy(state), copy.deepcopy((facts.trainable, facts.pairs))
        after = step(facts, state)
        assert state == before and (facts.trainable, facts.pairs) == facts_before, f"{step.__name__} mutated"
        changed = {f.name for f in fields(state) if getattr(after, f.name) is not getattr(state, f.name)}
        assert changed == ADDS[step.__name__]
        assert all(getattr(state, f) is None and getattr(after, f) is not None for f in changed)
        state = after
    assert state.programs == derive(prof, spelling, P, M, V, D).programs
