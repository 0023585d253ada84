"""MindFormers configs of any release plan (issue 38 point 4): keys only other releases define
(``schema.OTHER_RELEASES``) and training values only ``train`` reads are accepted by ``plan``, ``check`` and
``simulate`` and named once; ``train`` names the top-level ones as not used and refuses what it cannot honour;
a typo stays refused with the nearest key."""
import json
import os

import pytest

from hyperparallel import cli
from hyperparallel.errors import SpecError
from hyperparallel.recipe import load_recipe, schema

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ADAMW = os.path.join(ROOT, "recipes", "mf_llama_adamw.yaml")   # MindFormers' own optimizer / lr_schedule
OLD = ["--set", "auto_tune=False", "--set", "profiler_level=1", "--set", "runner_config.per_epoch_size=5"]
NOTE = ("note: keys of other MindFormers releases, without effect on the plan: auto_tune (1.7-1.9 configs), "
        "profiler_level (1.7-1.9 configs), runner_config.per_epoch_size (1.0-1.2 configs)")


def _main(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_plan_check_simulate_accept_other_release_keys_and_name_them_once(capsys):
    rc, out, err = _main(capsys, "plan", ADAMW, *OLD)
    assert rc == 0, err
    assert out.splitlines().count(NOTE) == 1, out
    rc, out, err = _main(capsys, "check", ADAMW, *OLD)
    assert rc == 0 and out.splitlines()[0] == NOTE and out.splitlines()[1].startswith("OK: "), (out, err)
    rc, out, err = _main(capsys, "simulate", ADAMW, *OLD, "--json")
    assert rc == 0 and json.loads(out)["notes"] == [NOTE], err
    rc, out, _ = _main(capsys, "plan", ADAMW)   # none given: no note
    assert rc == 0 and "other MindFormers releases" not in out


def test_a_typo_at_the_top_level_stays_refused_with_the_nearest_key(capsys):
    rc, _, err = _main(capsys, "plan", ADAMW, "--set", "auto_tun=False")
    assert rc == 2 and err.startswith("error: auto_tun: unknown key at the top level of the recipe;"), err
    rc, _, err = _main(capsys, "plan", ADAMW, "--set", "runner_config.per_epoch_sise=5")
    assert rc == 2 and "runner_config.per_epoch_sise: unknown key" in err, err


def test_plan_names_an_optimizer_train_refuses_and_train_refuses_it(capsys):
    """``optimizer.type: FP32StateAdamWeightDecay`` (a MindFormers 1.9 optimizer the runtime lacks): plan read
    the layout only, yet refused it; now it plans with a note, and train refuses it before launch."""
    bad = ("--set", "optimizer.type=FP32StateAdamWeightDecay")
    rc, out, err = _main(capsys, "plan", ADAMW, *bad)
    assert rc == 0, err
    assert ("note: optimizer.type: 'FP32StateAdamWeightDecay' is not supported; allowed: AdamW, Adam, SGD "
            "(train refuses it; the plan does not read it)") in out.splitlines()
    rc, out, err = _main(capsys, "train", ADAMW, "--steps", "1", *bad)
    assert rc == 2 and err.strip() == ("error: optimizer.type: 'FP32StateAdamWeightDecay' is not supported; "
                                       "allowed: AdamW, Adam, SGD"), err


def test_hyperparallels_own_train_section_stays_checked_by_plan():
    with pytest.raises(SpecError, match=r"^train\.nonfinite: 'maybe' unknown"):
        load_recipe(ADAMW, ["train.nonfinite=maybe"])


def test_train_names_the_top_level_ones_unused_and_refuses_the_section_ones():
    raw = load_recipe(ADAMW, ["auto_tune=False", "profiler_level=1", "recompute=False"]).raw
    assert {"auto_tune", "profiler_level", "recompute"} <= set(schema.unused_keys(raw))
    assert not [k for k, _ in schema.train_refusals(raw, "CPU") if k in schema.OTHER_RELEASES]
    raw = load_recipe(ADAMW, ["recompute=True", "runner_wrapper.sens=1024", "runner_config.image_size=224"]).raw
    found = dict(schema.train_refusals(raw, "CPU"))
    assert found["recompute"].startswith("True is not supported; give false: no recompute")
    assert found["runner_wrapper.sens"] == ("a key of MindFormers 1.0-1.5 configs: MindFormers 1.9.0 spells the loss "
                                            "scale scale_sense; give runner_wrapper.scale_sense")
    assert found["runner_config.image_size"].startswith("a key of MindFormers 1.0-1.5 configs: not a runner_config")
    assert "recompute" not in schema.unused_keys(raw)   # refused, so not also called unused


def test_other_release_keys_are_not_1_9_template_keys():
    """The list holds only what 1.9.0's template lacks (a key 1.9.0 defines belongs in its own list)."""
    for key in schema.OTHER_RELEASES:
        sec, _, name = key.rpartition(".")
        assert (name not in schema.STRICT[sec]) if sec else (key not in schema.TOP), key
