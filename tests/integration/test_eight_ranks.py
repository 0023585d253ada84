"""The paper's headline shape on real ranks: 8 msrun ranks, one launch for three layouts.

P=8 transpose, P=8 1f1b (8 LLM layers, one per stage) and P=4 x D=2 run as cases of one 8-rank job
(cases of different data-parallel degrees share the launch: ``Comm.with_data_parallel``); each
matches its single-process reference (losses of 3 steps within 1e-5 relative, every step-0 gradient
within 1e-5 of its scale).
"""
import os

import pytest

pytest.importorskip("mindspore", reason="mindspore is not installed")

from helpers import assert_equivalent, job_case, launch_cases, reference_run  # noqa: E402
from hyperparallel.recipe import load_recipe  # noqa: E402
from hyperparallel.testing import EIGHT_RANKS  # noqa: E402  (tools/eight_ranks.py times the same layouts)

RECIPE = os.path.join(os.path.dirname(__file__), "..", "..", "recipes", "tiny_mllm.yaml")
STEPS = 3
CASES = EIGHT_RANKS


@pytest.fixture(scope="module")
def eight(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("rt8"))
    cases = {name: job_case(tmp, RECIPE, sched, name, list(ov) + [f"train.steps={STEPS}"], steps=STEPS)
             for name, (sched, ov) in CASES.items()}
    res = launch_cases(tmp, list(cases.values()), 8, timeout=900)
    return cases, res


@pytest.mark.msrun
@pytest.mark.parametrize("name", list(CASES))
def test_eight_ranks_match_reference(eight, name):
    cases, _ = eight
    overrides = list(CASES[name][1]) + [f"train.steps={STEPS}"]
    grads = assert_equivalent(cases[name], *reference_run(load_recipe(RECIPE, overrides=overrides), STEPS))
    assert any(k.startswith("vision.") for k in grads) and any(k.startswith("llm.") for k in grads)
