"""The launcher's view of msrun's children (``launch._Ranks``): a rank caught between msrun's fork and
its exec (still msrun's command line and environment) is classified again once it runs the job file."""
import os
import subprocess
import sys
import time

from hyperparallel.launch import _Ranks

# the stand-in for a rank: first a process that is not one (no MS_ROLE, no job file on its command
# line), then, after exec, one that is
PRE_EXEC = ("import os, sys, time; time.sleep(float(os.environ['HOLD_S'])); "
            "env = dict(os.environ, MS_ROLE='MS_WORKER'); "
            "os.execve(sys.executable, [sys.executable, '-c', 'import time; time.sleep(30)', os.environ['JOBP']], env)")


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_a_child_seen_before_its_exec_becomes_a_rank_after_it(tmp_path):
    job = str(tmp_path / "job.json")
    env = {k: v for k, v in os.environ.items() if k != "MS_ROLE"}
    env.update(HOLD_S="1.5", JOBP=job)
    ranks = _Ranks(os.getpid(), job)
    p = subprocess.Popen([sys.executable, "-c", PRE_EXEC], env=env)
    try:
        time.sleep(0.3)
        ranks.refresh()
        assert p.pid in ranks.others and p.pid not in ranks.pids   # not a rank yet
        deadline = time.time() + 20
        while job.encode() not in _cmdline(p.pid):
            assert time.time() < deadline, "the stand-in never exec'd"
            time.sleep(0.05)
        ranks.refresh()
        assert p.pid in ranks.pids and p.pid not in ranks.others
        assert ranks.alive() == [p.pid]
    finally:
        p.kill()
        p.wait()
