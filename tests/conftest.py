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


def pytest_collection_modifyitems(config, items):
    """Test modules with more msrun cases first, each module's tests kept together and in order.

    ``make test`` runs the suite with ``pytest -n 2 --dist loadscope``: each worker takes whole
    modules in this order. The modules with the long launches (tens of seconds to minutes) start
    first and the short ones fill in at the end, so no worker is left alone on a long module while
    the other has nothing to do. A plain ``pytest`` run is unaffected but for the order."""
    launches = {}
    for item in items:
        launches.setdefault(item.module.__name__, 0)
        if item.get_closest_marker("msrun"):
            launches[item.module.__name__] += 1
    items.sort(key=lambda item: -launches[item.module.__name__])
