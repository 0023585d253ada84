import os
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(ROOT, "recipes")
sys.path.insert(0, os.path.join(ROOT, "tools"))   # tools/make_demo_data.py writes the tests' data sets
# mindone.transformers' auto and processor classes put folders of mindone's own package on sys.path, where
# ``import deprecated`` would then find mindone's models/deprecated package: the PyPI one MindFormers
# imports is imported first, so a test process that used them can still import MindFormers
import deprecated  # noqa: E402,F401
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
