"""The interpreter without a MindSpore job: where it prefetches data, and its explicit hooks."""
import os

import pytest

from hyperparallel.recipe import derive_recipe, load_recipe

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HEAVY = os.path.join(ROOT, "recipes", "bench_encoder_heavy.yaml")


def test_data_is_prefetched_before_the_receive_that_precedes_its_use():
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    from hyperparallel.runtime.interpreter import prefetch_points
    plan = derive_recipe(load_recipe(HEAVY), "1f1b")
    # device 0: F v0 F l0 SEND F v1 F l1 SEND | RECV g0: micro-batch 2 (and its pixels) built before it
    # blocks, not between the receive and BW 0 / F v2; likewise micro-batch 3 before RECV g1
    assert prefetch_points(plan.programs[0], ("vision", 0)) == {6: [(2, 0, True)], 11: [(3, 0, True)]}
    # device 1 receives every micro-batch's activation: its side inputs are built before each receive
    assert prefetch_points(plan.programs[1], ("vision", 0)) == {i: [(m, 0, False)] for m, i in
                                                              enumerate((0, 4, 8, 12))}
    # next-step spill: the next step's encoder inputs are loaded while device 0 waits for its last grads
    spill = derive_recipe(load_recipe(HEAVY), "transpose(spill=next_step)")
    pts = prefetch_points(spill.programs[0], ("vision", 0))
    assert pts[14] == [(0, 1, True), (2, 1, True), (1, 1, False)]
    # the window stops before a SEND: nothing is built ahead of a send
    for i, items in pts.items():
        assert spill.programs[0][i].kind == "RECV"


def test_fault_injection_hook_comes_from_the_environment(monkeypatch):
    from hyperparallel.runtime.hooks import Chain, FaultInjection, Hooks
    monkeypatch.setenv("HP_FAULT", "1:3:kill")
    f = FaultInjection.from_env(1)
    assert (f.rank, f.step, f.kill) == (1, 3, True) and f.per_action
    assert FaultInjection.from_env(0) is None   # another rank
    monkeypatch.setenv("HP_FAULT", "1:save:2")
    assert FaultInjection.from_env(1) is None   # dying while saving is the saver's
    assert not Hooks().per_action and not Chain([Hooks(), None]).per_action


def test_chained_hooks_wrap_in_order_and_no_hook_leaves_the_callable_alone():
    from hyperparallel.runtime.hooks import Chain, Hooks
    seen = []

    class Tag(Hooks):
        def __init__(self, name):
            self.name = name

        def wrap(self, category, name, fn):
            def call(*a):
                seen.append((self.name, category, name))
                return fn(*a)
            return call
    f = Chain([Tag("inner"), Tag("outer")]).wrap("comm", "send", lambda x: x + 1)
    assert f(1) == 2 and seen == [("outer", "comm", "send"), ("inner", "comm", "send")]
    g = len
    assert Hooks().wrap("data", "tensors", g) is g
