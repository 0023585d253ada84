"""The test processes' set-up and fixtures; what the tests share otherwise is in ``helpers.py``."""
import os
import tempfile

import pytest

# mindone.transformers' auto and processor classes put folders of mindone's own package on sys.path, where
# ``import deprecated`` would then find mindone's models/deprecated package: the PyPI one MindFormers
# imports is imported first, so a test process that used them can still import MindFormers
import deprecated  # noqa: E402,F401
# MindFormers writes logs under $LOCAL_DEFAULT_PATH (default ./output), read when it is imported:
# keep them out of the repository for every test and every job a test launches
os.environ.setdefault("LOCAL_DEFAULT_PATH", tempfile.mkdtemp(prefix="hp_mindformers_logs_"))

from helpers import run_main  # noqa: E402


@pytest.fixture
def cli():
    """``hyperparallel ARGS`` in process (:func:`helpers.run_main`): for commands that launch no rank."""
    return run_main
