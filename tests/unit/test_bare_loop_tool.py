"""tools/bare_loop.py refuses what the hand-written loop cannot run, before any launch."""
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HEAVY = os.path.join(ROOT, "recipes", "bench_encoder_heavy.yaml")


def test_bare_loop_refuses_what_it_cannot_run_before_launch(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bare_loop.py"), HEAVY, *args,
                               "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=60)
    p = run("--schedule", "transpose", "--set", "mpipe.profile.regions.0.trainable=true")
    assert p.returncode != 0 and "frozen encoder" in p.stderr, p.stderr
    p = run("--schedule", "gpipe")
    assert p.returncode != 0 and "--schedule" in p.stderr, p.stderr
    p = run("--pairs", "0")
    assert p.returncode != 0 and "--pairs" in p.stderr, p.stderr
    assert not (tmp_path / "run").exists()
