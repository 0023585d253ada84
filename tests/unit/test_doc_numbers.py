"""Figures in README.md and docs/ are what their commands print (tools/doc_numbers.py)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import doc_numbers  # noqa: E402


@pytest.mark.slow
def test_every_marked_figure_matches_its_command():
    """Simulated blocks re-run `hyperparallel simulate`; measured ones re-render docs/bench*.json."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "doc_numbers.py"), "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr


def test_blocks_cover_the_generators_and_a_changed_figure_is_caught():
    found = {}
    for doc in doc_numbers.DOCS:
        with open(os.path.join(ROOT, doc)) as f:
            text = f.read()
        for name, body in doc_numbers.blocks(text).items():
            found[name] = body
    assert set(found) == set(doc_numbers.GENERATORS)
    assert set(doc_numbers.SIMULATED) <= set(found)
    stale = found["encoder-heavy"].replace("95.08 ms", "87.6 ms")
    assert stale != found["encoder-heavy"]  # the spill example is generated, not typed
    text = "<!-- numbers:encoder-heavy -->\n" + stale + "<!-- /numbers:encoder-heavy -->\n"
    assert doc_numbers.render(text, {}) != text
