import os
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(ROOT, "recipes")
sys.path.insert(0, os.path.join(ROOT, "tools"))   # tools/make_demo_data.py writes the tests' data sets
# MindFormers writes logs under $LOCAL_DEFAULT_PATH (default ./output), read when it is imported:
# keep them out of the repository for every test and every job a test launches
os.environ.setdefault("LOCAL_DEFAULT_PATH", tempfile.mkdtemp(prefix="hp_mindformers_logs_"))


def run_cli(*args, timeout=120, env=None):
    """Run ``python -m hyperparallel ARGS`` and return the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "hyperparallel", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture
def cli():
    return run_cli


def recipe(name: str) -> str:
    return os.path.join(RECIPES, name)


# The modules that take longest, longest first: setup + call seconds of each under `make test` on this
# 2-core machine (a --durations=0 run, 2026-12): tiny equivalence 260, Qwen-VL 253, faults 237,
# MindFormers equivalence 152, 8 ranks 151, MindFormers training 151, checkpoint resume 150, train CLI 116,
# balance 110, bench 96, model adapters 91, conversations 89, tune 84, mindone 71, multinode 66, Python API 64.
LONG_MODULES = ("test_equivalence_tiny", "test_equivalence_qwen_vl", "test_faults", "test_equivalence_mindformers",
                "test_eight_ranks", "test_mindformers_training", "test_checkpoint_resume", "test_train_cli",
                "test_balance", "test_bench", "test_model_adapters", "test_data_conversations", "test_tune",
                "test_mindone_cpu", "test_multinode", "test_python_api")


def pytest_collection_modifyitems(config, items):
    """The long test modules first (:data:`LONG_MODULES`, then modules with msrun cases), each module's
    tests kept together and in order.

    ``make test`` runs the suite with ``pytest -n N --dist loadscope``: each worker takes whole
    modules in this order. The modules with the long launches start first and the short ones fill in
    at the end, so no worker is left alone on a long module while the others have nothing to do. A
    plain ``pytest`` run is unaffected but for the order."""
    launches = {}
    for item in items:
        name = item.module.__name__.rpartition(".")[2]
        launches.setdefault(name, 0)
        if item.get_closest_marker("msrun"):
            launches[name] += 1

    def key(item):
        name = item.module.__name__.rpartition(".")[2]
        listed = LONG_MODULES.index(name) if name in LONG_MODULES else len(LONG_MODULES)
        return listed, -launches[name]
    items.sort(key=key)
