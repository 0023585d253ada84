"""Production faults on the launcher (issue 24): a hung rank, preemption by signals, save failures.

Fast: the hang verdict on synthetic heartbeats, refused settings, the launcher's signal handling
against a fake msrun (tests/fake_msrun.py; no MindSpore). ``msrun``: one chain of real 2-rank
``hyperparallel train`` runs on one save directory, each interrupted another way, the last one
finishing: its losses (steps 1-16, written by ten runs) equal the single-process reference.

1. SIGINT (Ctrl-C) to ``hyperparallel train`` while step 2 runs (``HP_FAULT=1:1:SIGINT``)
                                        -> step 2 finished and saved, exit 75, the lines name SIGINT
2. SIGTERM to msrun                     -> the same (the ranks get SIGHUP when msrun dies)
3. SIGTERM to rank 1 alone              -> every rank stops after the same step, exit 75
4. disk full while saving (fault hook)  -> exit 74 naming the path and ENOSPC; older steps intact
5. rank 1 hangs (``HP_FAULT=1:S:hang``) -> exit 124 within train.hang_timeout_s, the rank named
   SIGSTOP of rank 1, then of rank 0   -> exit 124, the stopped rank named (its pid), not its waiting peer
   SIGKILL to ``hyperparallel train``  -> the ranks stop after their step; no process of the job is left
6. SIGTERM twice to ``train``           -> every rank killed at once, exit 143, the last checkpoint intact
7. ``--resume`` to the end              -> exit 0, losses equal the reference
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hyperparallel.watch import Heartbeat, hang_verdict, read_beats

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "tiny_mllm.yaml")
FAKE = os.path.join(ROOT, "tests", "fake_msrun.py")
STEPS = 16


def beat(rank, kind, index=5, waits=(), since=0.0, step=3, what="llm/1 micro 2", first_step=0, pid=1):
    return {"rank": rank, "pid": pid, "step": step, "first_step": first_step, "index": index, "length": 24,
            "kind": kind, "waits": list(waits), "what": what, "since": since}


# -- the hang verdict ---------------------------------------------------------------------------------

def test_hang_verdict_follows_the_wait_chain_to_the_stuck_rank():
    beats = {0: beat(0, "RECV", 14, [1], since=90.0, what="llm/0 micro 3 grad from rank 1"),
             1: beat(1, "F", 11, since=80.0, what="llm/1 micro 2")}
    line = hang_verdict(beats, 10.0, now=100.0)
    assert line == ("rank 1 hung: no progress for 20.0 s (train.hang_timeout_s 10) in step 3 at program index 11/24 "
                    "(F llm/1 micro 2), not waiting on a peer; rank 0 waits on it at program index 14/24 "
                    "(RECV llm/0 micro 3 grad from rank 1)")


def test_hang_verdict_chain_through_a_collective_and_a_cycle():
    beats = {0: beat(0, "reduce", -1, [1, 2, 3], since=10.0, what=""), 1: beat(1, "RECV", 3, [2], since=20.0),
             2: beat(2, "RECV", 4, [3], since=30.0), 3: beat(3, "BW", 7, since=40.0)}
    assert hang_verdict(beats, 5.0, now=100.0).startswith("rank 3 hung: no progress for 60.0 s")
    cycle = {0: beat(0, "RECV", 2, [1], since=10.0), 1: beat(1, "RECV", 2, [0], since=20.0)}
    assert hang_verdict(cycle, 5.0, now=100.0).startswith("rank 0 hung:")   # a cycle: the rank stuck longest


def test_a_blocked_send_waits_on_its_peer():
    """Rank 0 stuck longest in a send to rank 1, rank 1 in compute: the send is held up by rank 1 (on CPU a
    send that does not return waits on the receiver), so rank 1 is named, not the sender."""
    beats = {0: beat(0, "SEND", 11, [1], since=80.0, what="llm/0 micro 2 act to rank 1"),
             1: beat(1, "F", 9, since=90.0, what="llm/1 micro 1")}
    assert hang_verdict(beats, 5.0, now=100.0) == (
        "rank 1 hung: no progress for 10.0 s (train.hang_timeout_s 5) in step 3 at program index 9/24 (F llm/1 micro 1)"
        ", not waiting on a peer; rank 0 waits on it at program index 11/24 (SEND llm/0 micro 2 act to rank 1)")


def test_hang_verdict_names_the_stopped_process_not_the_rank_waiting_on_it():
    """SIGSTOP of one rank: its peer blocks in a send to it or a receive from it. The heartbeats alone
    cannot tell them apart (a wait cycle); the stopped process's state (``T``, by the heartbeat's pid) does,
    in both directions and whichever rank got stuck first."""
    # rank 1 stopped in a receive from rank 0; rank 0 blocked in its send to rank 1 (stuck longest)
    beats = {0: beat(0, "SEND", 11, [1], since=80.0, what="llm/0 micro 2 act to rank 1", pid=4100),
             1: beat(1, "RECV", 12, [0], since=85.0, what="llm/0 micro 2 act from rank 0", pid=4101)}
    assert hang_verdict(beats, 5.0, now=100.0, states={0: "S", 1: "T"}) == (
        "rank 1 stopped (SIGSTOP?), pid 4101: no progress for 15.0 s (train.hang_timeout_s 5) in step 3 at program "
        "index 12/24 (RECV llm/0 micro 2 act from rank 0); rank 0 waits on it at program index 11/24 "
        "(SEND llm/0 micro 2 act to rank 1)")
    # the other way round: rank 0 stopped, rank 1 stuck longest
    assert hang_verdict(beats, 5.0, now=100.0, states={0: "T", 1: "S"}).startswith(
        "rank 0 stopped (SIGSTOP?), pid 4100: no progress for 20.0 s (train.hang_timeout_s 5) in step 3 at program "
        "index 11/24 (SEND llm/0 micro 2 act to rank 1); rank 1 waits on it at program index 12/24 (RECV ")
    # a rank in compute does not outrank a stopped one; a debugger's stop ('t') is named as such
    compute = {0: beat(0, "RECV", 4, [1], since=90.0, pid=4100), 1: beat(1, "F", 5, since=80.0, pid=4101)}
    assert hang_verdict(compute, 5.0, now=100.0, states={0: "t", 1: "R"}).startswith(
        "rank 0 stopped (traced: a debugger?), pid 4100: no progress for 10.0 s")
    # several stopped: the longest-stuck is named, the others listed
    both = hang_verdict(beats, 5.0, now=100.0, states={0: "T", 1: "T"})
    assert both.startswith("rank 0 stopped (SIGSTOP?), pid 4100: ") and "(stopped too: rank 1)" in both
    assert "waits on it" not in both
    # a stopped local rank is named at the usual time, even while it waits on another node's rank
    remote = {0: beat(0, "barrier", -1, [1, 2], since=0.0, what="", pid=4100), 1: beat(1, "RECV", 3, [2], since=0.0)}
    assert hang_verdict(remote, 10.0, now=11.0) is None
    assert hang_verdict(remote, 10.0, now=11.0, states={0: "T"}).startswith("rank 0 stopped (SIGSTOP?), pid 4100")
    # a save is not judged, unless the saving process is stopped
    saving = {0: beat(0, "save", since=0.0, what="", pid=4100), 1: beat(1, "barrier", -1, [0], since=0.0, what="")}
    assert hang_verdict(saving, 10.0, now=11.0, states={0: "S"}) is None
    assert hang_verdict(saving, 10.0, now=11.0, states={0: "T"}).startswith("rank 0 stopped (SIGSTOP?), pid 4100: ")


def test_no_hang_while_any_rank_moves_or_saves_or_starts():
    stuck = {0: beat(0, "RECV", 2, [1], since=0.0), 1: beat(1, "F", 3, since=0.0)}
    assert hang_verdict(stuck, 10.0, now=11.0)
    assert hang_verdict({**stuck, 1: beat(1, "F", 3, since=5.0)}, 10.0, now=11.0) is None   # rank 1 moved
    assert hang_verdict({**stuck, 1: beat(1, "save", since=0.0)}, 10.0, now=11.0) is None
    assert hang_verdict(stuck, 10.0, now=11.0, ranks=[0, 1, 2]) is None   # rank 2 has no heartbeat yet
    first = {r: dict(b, step=0) for r, b in stuck.items()}   # the first step gets 5x the timeout
    assert hang_verdict(first, 10.0, now=49.0) is None and hang_verdict(first, 10.0, now=51.0)


def test_a_wait_on_another_nodes_rank_is_judged_later_and_says_so():
    # node 0's launcher sees ranks 0 and 1 only; both wait in the end barrier on ranks 2 and 3 (node 1)
    node0 = {0: beat(0, "barrier", -1, [1, 2, 3], since=0.0, what=""), 1: beat(1, "barrier", -1, [0, 2, 3], since=1.0,
                                                                           what="")}
    assert hang_verdict(node0, 10.0, now=30.0) is None       # node 1's launcher judges its ranks first
    line = hang_verdict(node0, 10.0, now=52.0)               # 5x the timeout: node 1 is gone
    assert line == ("rank 0 hung: no progress for 52.0 s (train.hang_timeout_s 10) in step 3 at (barrier), waiting on "
                    "ranks 1, 2, 3 (ranks 2, 3 not on this node); rank 1 waits on it at (barrier)")
    # a local rank stuck in compute is named at the usual time, whatever the others wait on
    mixed = {0: beat(0, "RECV", 2, [1], since=0.0), 1: beat(1, "F", 3, since=0.0)}
    assert hang_verdict(mixed, 10.0, now=11.0, ranks=[0, 1]).startswith("rank 1 hung")


def test_heartbeat_file_round_trip(tmp_path):
    hb = Heartbeat(str(tmp_path), 3, first_step=2)
    hb.beat(4, "RECV", 7, 20, [1], "vision/0 micro 1 act from rank 1")
    hb.beat(4, "F", 8, 20, (), "llm/0 micro 1")   # rewritten in place: a shorter record leaves no tail
    got = read_beats(str(tmp_path))
    assert list(got) == [3] and os.path.getsize(tmp_path / "progress_3.json") == 512
    assert {k: got[3][k] for k in ("step", "first_step", "index", "length", "kind", "waits", "what")} == \
        {"step": 4, "first_step": 2, "index": 8, "length": 20, "kind": "F", "waits": [], "what": "llm/0 micro 1"}
    hb.close()


# -- refused before launch ----------------------------------------------------------------------------

def train(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "hyperparallel", "train", RECIPE, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})))


@pytest.mark.parametrize("args,env,words", [
    (["--set", "train.hang_timeout_s=0"], {}, "error: train.hang_timeout_s: must be a number > 0, got 0"),
    (["--set", "train.stop_grace_s=-5"], {}, "error: train.stop_grace_s: must be a number > 0, got -5"),
    (["--set", "train.hang_timeout_s=fast"], {}, "error: train.hang_timeout_s: must be a number > 0, got 'fast'"),
    ([], {"HP_MSRUN_ARGS": "--worker_num=4 --local_worker_num=2 --node_rank=2"},
     "error: HP_MSRUN_ARGS --worker_num: 4 but the plan needs parallel_config.pipeline_stage x data_parallel x "
     "model_parallel = 2 ranks; allowed: 2"),
    (["--set", "parallel_config.data_parallel=2"], {"HP_MSRUN_ARGS": "--local_worker_num=2 --node_rank=2"},
     "error: HP_MSRUN_ARGS --node_rank: 2 but 4 ranks of 2 per node make 2 node(s): 0..1"),
    (["--set", "parallel_config.pipeline_stage=3"], {"HP_MSRUN_ARGS": "--local_worker_num=2"},
     "error: HP_MSRUN_ARGS --local_worker_num: 2 must divide the job's 3 ranks"),
    ([], {"HP_MSRUN_ARGS": "--cluster_time_out=soon"},
     "error: HP_MSRUN_ARGS --cluster_time_out: must be a whole number, got 'soon'"),
])
def test_bad_fault_settings_refused_before_launch(tmp_path, args, env, words):
    p = train(*args, "--run-dir", str(tmp_path / "run"), env=env, timeout=60)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith(words), p.stderr
    assert not (tmp_path / "run" / "logs").exists()   # nothing launched


def test_unwritable_save_dir_refused_before_launch(tmp_path):
    """A read-only folder (as root, which writes through permissions: a folder the kernel refuses, in /proc):
    one line naming the path and the OS error, before any rank starts."""
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    try:
        target = str(ro / "ckpt") if not os.access(ro, os.W_OK) else "/proc/hp_read_only_ckpt"
        p = train("--save-dir", target, "--run-dir", str(tmp_path / "run"), timeout=60)
    finally:
        os.chmod(ro, 0o700)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: --save-dir: {target}"), p.stderr
    assert "cannot be" in lines[0] and not (tmp_path / "run" / "logs").exists()


def test_save_errors_are_named_with_path_and_os_error():
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    import errno
    from hyperparallel.runtime.checkpoint import os_error_text
    e = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/ckpt/step_3/.tmp_rank_1.safetensors")
    assert os_error_text(e) == "/ckpt/step_3/.tmp_rank_1.safetensors: No space left on device (ENOSPC)"
    try:   # MindSpore re-raising over an OSError: the OSError is named
        try:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/ro/step_1")
        except OSError as inner:
            raise RuntimeError("Failed to save the checkpoint file") from inner
    except RuntimeError as outer:
        assert os_error_text(outer) == "/ro/step_1: Permission denied (EACCES)"

    class SafetensorError(Exception):   # what the safetensors writer raises (not an OSError)
        pass
    msg = 'Error while serializing: I/O error: No space left on device (os error 28) at path "/ckpt/.tmpX"'
    assert os_error_text(SafetensorError(msg + "\nmore")) == msg


# -- the launcher's signal handling, against a fake msrun (seconds, no MindSpore) -----------------------

def _drive(tmp_path, mode, grace, send, hang=None):
    """Start fake_msrun.py drive; once both fake ranks run, ``send(driver, msrun pid)``; return (result, rank pids)."""
    p, pids = _drive_start(tmp_path, mode, grace, hang)
    msrun = [int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()]
    send(p, msrun[0])
    out, err = p.communicate(timeout=60)
    return json.loads(out.strip().splitlines()[-1]), pids, err


def _drive_start(tmp_path, mode, grace, hang=None):
    """fake_msrun.py drive started, both fake ranks running and seen by the launcher: (driver, rank pids)."""
    log = tmp_path / "log"
    p = subprocess.Popen([sys.executable, FAKE, "drive", str(log), mode, str(grace)] + ([str(hang)] if hang else []),
                         cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    pids, deadline = {}, time.time() + 60
    while len(pids) < 2 and time.time() < deadline:
        for r in (0, 1):
            f = log / f"worker_{r}.log"
            m = re.search(r"pid (\d+)", f.read_text()) if f.exists() else None
            if m:
                pids[r] = int(m.group(1))
        time.sleep(0.1)
    time.sleep(0.8)   # the launcher has seen the ranks (it looks every 0.5 s)
    return p, pids


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_grace_running_out_kills_every_rank(tmp_path):
    res, pids, err = _drive(tmp_path, "ignore", 1.0, lambda p, m: p.send_signal(signal.SIGTERM))
    assert res["returncode"] == 143 and res["killed"] == "stopped at once: the 1 s grace ran out; every rank killed"
    assert "SIGTERM: every rank finishes its step, then exits (up to 1 s; a second signal stops at once)" in err
    assert all(_gone(p) for p in pids.values())


def test_second_signal_stops_at_once(tmp_path):
    def twice(p, m):
        p.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
    res, pids, _ = _drive(tmp_path, "ignore", 60.0, twice)
    assert res["returncode"] == 130 and res["killed"].startswith("stopped at once: second signal (SIGINT)")
    assert all(_gone(p) for p in pids.values())


def test_clean_stop_is_reported_as_preempted(tmp_path):
    """Ctrl-C (SIGINT) to the launcher reaches the ranks as SIGINT: the stop line names the signal sent."""
    res, pids, err = _drive(tmp_path, "stop", 60.0, lambda p, m: p.send_signal(signal.SIGINT))
    assert "SIGINT: every rank finishes its step, then exits" in err
    assert res["returncode"] == 75 and res["stopped"] == "SIGINT after step 3/9; no --save-dir: nothing saved"
    assert not res["killed"] and all(_gone(p) for p in pids.values())


def test_finished_job_ends_on_the_ranks_done_files_without_waiting_for_msrun(tmp_path):
    """Every rank wrote ``done_<rank>`` (its last act) but neither it nor msrun exits: the launcher ends the
    job as finished (status 0; waiting for msrun would run into the 60 s timeout, status 124) and kills them."""
    res, pids, _ = _drive(tmp_path, "done", 60.0, lambda p, m: None)
    assert res["returncode"] == 0 and not res["killed"] and not res["message"], res
    assert all(_gone(p) for p in pids.values())


def test_a_silently_killed_rank_is_seen_by_its_pid_and_named(tmp_path):
    """Rank 1 SIGKILLed: no traceback, no fault line, and this msrun never reports a worker's exit. The
    launcher sees the process gone without its done file and ends the job naming the rank (without the
    pid check it would wait for the 60 s job timeout, status 124)."""
    def kill_rank_1(p, m):
        os.kill(int(re.search(r"pid (\d+)", (tmp_path / "log" / "worker_1.log").read_text()).group(1)),
                signal.SIGKILL)
    res, pids, _ = _drive(tmp_path, "ignore", 60.0, kill_rank_1)
    assert res["returncode"] == 1 and res["message"].startswith("rank 1 failed: "), res   # a timeout is 124
    assert all(_gone(p) for p in pids.values())


def test_msrun_killed_under_its_ranks_leaves_no_orphan(tmp_path):
    res, pids, err = _drive(tmp_path, "ignore", 1.0, lambda p, m: os.kill(m, signal.SIGTERM))
    assert res["msrun_gone"] and "msrun ended (status -15) with 2 rank(s) running" in err
    assert res["returncode"] == 143 and res["killed"].startswith("msrun ended and the ranks did not stop")
    assert all(_gone(p) for p in pids.values())


@pytest.mark.parametrize("stopped", [0, 1])
@pytest.mark.slow
def test_a_sigstopped_rank_is_named_not_the_rank_blocked_on_it(tmp_path, stopped):
    """SIGSTOP of rank S in a receive from its peer, which is blocked in a send to S and got stuck first: the
    heartbeats alone make a wait cycle (a send waits on its receiver) whose longest-stuck rank is the peer;
    the launcher reads S's process state by its heartbeat's pid (``T``) and names S, in both directions."""
    log = tmp_path / "log"

    def freeze_then_stop(p, m):
        (log / "freeze").touch()
        deadline = time.time() + 30
        while read_beats(str(log)).get(stopped, {}).get("kind") != "RECV":
            assert time.time() < deadline, "the fake rank never blocked"
            time.sleep(0.02)
        pid = int(re.search(r"pid (\d+)", (log / f"worker_{stopped}.log").read_text()).group(1))
        os.kill(pid, signal.SIGSTOP)
    res, pids, _ = _drive(tmp_path, f"blocked{stopped}", 60.0, freeze_then_stop, hang=3.0)
    peer = 1 - stopped
    assert res["returncode"] == 124 and res["hung"].startswith(
        f"rank {stopped} stopped (SIGSTOP?), pid {pids[stopped]}: no progress for "), res
    assert res["hung"].endswith(f"(train.hang_timeout_s 3) in step 3 at program index 12/24 (RECV llm/0 micro 2 act "
                                f"from rank {peer}); rank {peer} waits on it at program index 11/24 (SEND llm/0 "
                                f"micro 2 act to rank {stopped})"), res
    assert all(_gone(p) for p in pids.values())   # the stopped rank too (SIGKILL ends a stopped process)


def _left(path):
    """Processes (not zombies) with ``path`` in their command line or environment, other than this one."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid() or _gone(int(name)):
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if path.encode() in cmd or path.encode() in env:
            out.append((int(name), cmd.replace(b"\0", b" ").decode(errors="replace")[:200]))
    return out


def _wait_none_left(path, timeout):
    """Wait (at most ``timeout`` s) until no process of the job is left; returns those still there."""
    deadline = time.time() + timeout
    while _left(path) and time.time() < deadline:
        time.sleep(0.25)
    return _left(path)


@pytest.mark.slow
def test_sigkill_of_the_launcher_leaves_no_process_of_the_job(tmp_path):
    """SIGKILL of the launcher: msrun dies of its parent-death signal, but its ``tail -f`` log followers (its
    own children) and ranks that do not stop (mode ``ignore``) would live on for ever, parent 1. The launcher's
    guardian waits out the grace, then kills them all, and says so in LOG_DIR/launcher_gone.log."""
    p, pids = _drive_start(tmp_path, "ignore", 1.0)
    log = str(tmp_path / "log")
    assert any("tail -f" in cmd for _, cmd in _left(log))   # msrun's followers run
    p.kill()
    p.wait()
    left = _wait_none_left(log, 60)
    for pid, _ in left:   # a failed test leaves nothing behind either
        os.kill(pid, signal.SIGKILL)
    assert not left, left
    assert all(_gone(q) for q in pids.values())
    with open(os.path.join(log, "launcher_gone.log")) as f:
        report = f.read()
    assert report.startswith(f"the launcher (pid {p.pid}) is gone without ending the job: the ranks had up to 11 s")
    assert re.search(r"; killed \d+ left: pids ", report), report


# -- real 2-rank runs: one save directory, ten runs, each stopped another way --------------------------

class Run:
    """A ``hyperparallel train`` in the background, its console read line by line."""

    def __init__(self, run_dir, ckpt, *args, env=None):
        self.run_dir, self.lines = str(run_dir), []
        # the optimizer's update op by op: bit-identical, no ~1.5 s compile in each of the ten runs
        cmd = [sys.executable, "-m", "hyperparallel", "train", RECIPE, "--steps", str(STEPS), "--save-dir", str(ckpt),
               "--run-dir", self.run_dir, "--set", "train.optimizer_compile=eager", "--compile", "eager", *args]
        self.p = subprocess.Popen(cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=dict(os.environ, **(env or {})))
        self.t0 = time.time()

    def until(self, pattern, timeout=300):
        """Read the console until a line matches; returns the match."""
        while time.time() - self.t0 < timeout:
            line = self.p.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(pattern, line)
            if m:
                return m
        raise AssertionError(f"{pattern!r} not seen: {''.join(self.lines)[-3000:]}")

    def rank_pid(self, rank):
        text = open(os.path.join(self.run_dir, "logs", f"worker_{rank}.log")).read()
        return int(re.search(r"hyperparallel worker rank \d+ pid (\d+)", text).group(1))

    def msrun_pid(self):
        out = subprocess.run(["pgrep", "-P", str(self.p.pid)], capture_output=True, text=True).stdout.split()
        return int(out[0])

    def finish(self, timeout=300):
        out, err = self.p.communicate(timeout=timeout)
        self.lines.append(out)
        self.wall = time.time() - self.t0
        self.stdout, self.stderr, self.code = "".join(self.lines), err, self.p.returncode
        self.pids = [int(x) for x in re.findall(r"hyperparallel worker rank \d+ pid (\d+)", "".join(
            open(os.path.join(self.run_dir, "logs", f)).read() for f in os.listdir(os.path.join(self.run_dir, "logs"))
            if f.startswith("worker_")))]
        return self


def _stopped_at(run):
    m = re.search(r"stopped \(exit 75\): (.+?) after step (\d+)/%d; checkpoint (\S+) saved; continue with --resume"
                  % STEPS, run.stderr)
    assert run.code == 75 and m, (run.code, run.stderr[-2000:], run.stdout[-2000:])
    return int(m.group(2)), m.group(3)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    d = tmp_path_factory.mktemp("faults")
    ckpt, run = d / "ckpt", d / "run"
    out = {}
    # 1. SIGINT to hyperparallel train, sent by rank 1 in the middle of step index 1 (the console's step 2)
    out["train"] = Run(run, ckpt, env={"HP_FAULT": "1:1:SIGINT"}).finish()
    out["train_log1"] = open(os.path.join(str(run), "logs", "worker_1.log")).read()   # the next run starts anew
    r = Run(run, ckpt, "--resume")                       # 2. SIGTERM to msrun
    r.until(r" step \d+/%d " % STEPS)
    os.kill(r.msrun_pid(), signal.SIGTERM)
    out["msrun"] = r.finish()
    r = Run(run, ckpt, "--resume")                       # 3. SIGTERM to rank 1 only
    r.until(r" step \d+/%d " % STEPS)
    os.kill(r.rank_pid(1), signal.SIGTERM)
    out["rank"] = r.finish()
    k = _stopped_at(out["rank"])[0]
    out["rank_complete"] = [s for s, _ in cf().list_steps(str(ckpt))[0]]
    # 4. the disk is full when rank 1 writes step k + 1
    out["full"] = Run(run, ckpt, "--resume", "--save-every", "1", env={"HP_FAULT": f"1:save:{k + 1}:enospc"}).finish()
    out["full_complete"] = [s for s, _ in cf().list_steps(str(ckpt))[0]]
    out["full_resumes"] = cf().resolve(str(ckpt)).step
    # 5. rank 1 hangs in its second step (step index k + 1)
    out["hang"] = Run(run, ckpt, "--resume", "--set", "train.hang_timeout_s=6",
                      env={"HP_FAULT": f"1:{k + 1}:hang"}).finish()
    logs = os.path.join(str(run), "logs")   # as the hung run left them (the next run starts new ones)
    out["hang_logs"] = {f: open(os.path.join(logs, f)).read() for f in os.listdir(logs) if f.startswith("worker_")}
    for rank in (1, 0):                                  # 5b, 5c. SIGSTOP of rank 1, then of rank 0
        r = Run(run, ckpt, "--resume", "--set", "train.hang_timeout_s=4")
        r.until(r" step \d+/%d " % STEPS)
        r.until(r" step \d+/%d " % STEPS)              # past the run's first step (5x the allowance)
        out[f"sigstop{rank}_pid"] = r.rank_pid(rank)
        os.kill(r.rank_pid(rank), signal.SIGSTOP)
        out[f"sigstop{rank}"] = r.finish()
    r = Run(run, ckpt, "--resume")                       # 5d. SIGKILL of hyperparallel train
    r.until(r" step \d+/%d " % STEPS)
    r.p.kill()
    r.p.wait()
    out["sigkill_left"] = _wait_none_left(str(run), 90)
    for pid, _ in out["sigkill_left"]:   # the chain goes on without them
        os.kill(pid, signal.SIGKILL)
    out["sigkill_launcher"] = r.p.pid
    out["sigkill_logs"] = {f: open(os.path.join(logs, f)).read() for f in os.listdir(logs)
                           if f.startswith("worker_") or f == "launcher_gone.log"}
    r = Run(run, ckpt, "--resume")                       # 6. two SIGTERMs: stop at once
    r.until(r" step \d+/%d " % STEPS)
    r.p.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    r.p.send_signal(signal.SIGTERM)
    out["twice"] = r.finish()
    out["twice_resumes"] = cf().resolve(str(ckpt)).step
    out["last"] = Run(run, ckpt, "--resume").finish()   # 7. to the end
    out["k"], out["ckpt"], out["run"] = k, str(ckpt), str(run)
    return out


def cf():
    from hyperparallel.runtime import ckpt_files
    return ckpt_files


def _no_rank_left(run):
    assert run.pids and all(_gone(p) for p in run.pids), run.pids


@pytest.mark.msrun
@pytest.mark.parametrize("how", ["train", "msrun", "rank"])
def test_sigterm_finishes_the_step_saves_it_and_exits_75(chain, how):
    run = chain[how]
    step, path = _stopped_at(run)
    assert cf().verdict(path) == "" and path == os.path.join(chain["ckpt"], f"step_{step}")
    assert f"] step {step}/{STEPS} " in run.stdout and f"] step {step + 1}/{STEPS} " not in run.stdout
    if how == "train":   # the launcher's own word on the console
        assert "SIGINT: every rank finishes its step and saves it, then exits (up to 25 s" in run.stderr
    if how == "msrun":
        assert "msrun ended (status -15) with 2 rank(s) running: they finish their step and exit" in run.stderr
    _no_rank_left(run)


@pytest.mark.msrun
def test_ctrl_c_during_a_step_stops_after_that_step_and_names_sigint(chain):
    """SIGINT reached the launcher while step 2 ran (rank 1 sent it mid-program and went on only once the
    forwarded signal reached it): every rank stops after step 2, not 3, and both the rank's line and the
    launcher's last line name SIGINT, the signal sent (not the SIGTERM it used to forward)."""
    run = chain["train"]
    log1 = chain["train_log1"]
    assert "fault injection: rank 1 sends SIGINT to the launcher" in log1 and " in step 1" in log1
    assert f"stopped on signal: SIGINT after step 2/{STEPS}; checkpoint " in run.stdout, run.stdout[-2000:]
    assert re.search(r"stopped \(exit 75\): SIGINT after step 2/%d; checkpoint \S+step_2 saved" % STEPS,
                     run.stderr), run.stderr[-2000:]
    assert _stopped_at(run)[0] == 2 and f"] step 3/{STEPS} " not in run.stdout


@pytest.mark.msrun
def test_signal_to_one_rank_stops_every_rank_after_the_same_step(chain):
    step, _ = _stopped_at(chain["rank"])
    logs = os.path.join(chain["rank"].run_dir, "logs")
    assert "msrun" not in chain["rank"].stderr and "SIGTERM: every rank" not in chain["rank"].stderr
    files = os.listdir(os.path.join(chain["ckpt"], f"step_{step}"))
    assert sorted(files) == ["COMPLETE", "meta.json", "rank_0.safetensors", "rank_1.safetensors"]
    assert "Traceback" not in open(os.path.join(logs, "worker_0.log")).read()


@pytest.mark.msrun
def test_full_disk_ends_the_job_naming_path_and_error(chain):
    run, k = chain["full"], chain["k"]
    tmp = os.path.join(chain["ckpt"], f"step_{k + 1}", ".tmp_rank_1.safetensors")
    err = run.stderr.strip().splitlines()[-1]
    assert run.code == 74 and err == (f"error: job failed (exit 74): checkpoint save failed: {tmp}: No space left on "
                                      f"device (ENOSPC) (rank 1, step {k + 1}); newest complete checkpoint: "
                                      f"{os.path.join(chain['ckpt'], f'step_{k}')}"), run.stderr[-2000:]
    assert chain["full_complete"] == chain["rank_complete"]   # nothing older touched, step k + 1 not complete
    assert chain["full_resumes"] == k
    _no_rank_left(run)


@pytest.mark.msrun
def test_hung_rank_ends_the_job_naming_rank_index_kind_and_peer(chain):
    run = chain["hang"]
    err = run.stderr.strip().splitlines()
    assert run.code == 124 and len(err) == 1, run.stderr[-2000:]
    m = re.match(r"error: job hung \(exit 124\): rank 1 hung: no progress for [\d.]+ s \(train.hang_timeout_s 6\) in "
                 r"step (\d+) at program index (\d+)/(\d+) \((\w+) [^)]*\), (not waiting on a peer|waiting on rank 0); "
                 r"rank 0 waits on it at (?:program index \d+/\d+ )?\((RECV|SEND|reduce)[^)]*\) "
                 r"\(logs: (\S+)/worker_<rank>.log\); newest complete checkpoint: ", err[0])
    assert m and int(m.group(1)) == chain["k"] + 1, err[0]
    assert int(m.group(2)) == int(m.group(3)) // 2   # where HP_FAULT stopped it: the middle of the program
    logs = chain["hang_logs"]   # every worker's log kept
    assert m.group(7) == os.path.join(chain["run"], "logs") and sorted(logs) == ["worker_0.log", "worker_1.log"]
    assert f"] step {chain['k'] + 1}/{STEPS} " in logs["worker_0.log"]
    assert "fault injection (hang): rank 1 stops making progress" in logs["worker_1.log"]
    assert "Recv failed" not in logs["worker_0.log"]   # ended before MCCL's own 30 s receive timeout
    _no_rank_left(run)


@pytest.mark.msrun
@pytest.mark.parametrize("rank", [0, 1])
def test_sigstop_of_a_rank_names_that_rank_not_its_waiting_peer(chain, rank):
    """SIGSTOP of one rank: no rank moves, the healthy one is blocked on the stopped one (in a send, a receive
    or a collective); the verdict names the stopped rank and its pid, in both directions."""
    run, peer = chain[f"sigstop{rank}"], 1 - rank
    err = run.stderr.strip().splitlines()
    assert run.code == 124 and len(err) == 1, run.stderr[-2000:]
    m = re.match(r"error: job hung \(exit 124\): rank %d stopped \(SIGSTOP\?\), pid %d: no progress for [\d.]+ s "
                 r"\(train.hang_timeout_s 4\) in step \d+ at [^;]*; rank %d waits on it at " % (
                     rank, chain[f"sigstop{rank}_pid"], peer), err[0])
    assert m, err[0]
    _no_rank_left(run)   # the stopped rank too


@pytest.mark.msrun
def test_sigkill_of_train_leaves_no_process_of_the_job(chain):
    """SIGKILL of ``hyperparallel train``: the ranks stop after their step as when msrun dies (SIGHUP), and then
    nothing of the job is left -- no rank, no msrun, no scheduler, none of msrun's ``tail -f`` log followers."""
    assert not chain["sigkill_left"], chain["sigkill_left"]
    logs = chain["sigkill_logs"]
    assert re.search(r"^stopped on signal: SIGTERM after step \d+/%d; checkpoint \S+ saved$" % STEPS,
                     logs["worker_0.log"], re.M), logs["worker_0.log"][-2000:]
    assert logs["launcher_gone.log"].startswith(f"the launcher (pid {chain['sigkill_launcher']}) is gone without "
                                                f"ending the job: the ranks had up to 35 s to stop after their step")


@pytest.mark.msrun
def test_second_signal_kills_every_rank_at_once_and_keeps_the_last_checkpoint(chain):
    run = chain["twice"]
    err = run.stderr.strip().splitlines()[-1]
    assert run.code == 143 and err.startswith("error: job stopped (exit 143): stopped at once: second signal "
                                              "(SIGTERM); every rank killed; newest complete checkpoint: "), err
    # what --resume takes is the complete checkpoint the line names: the one before, or the step the first
    # signal finished and saved when that save was done before the second signal came (a fast tiny step)
    named = err.split("newest complete checkpoint: ", 1)[1].strip()
    assert os.path.basename(named) == f"step_{chain['twice_resumes']}", (named, chain["twice_resumes"])
    assert chain["twice_resumes"] >= chain["full_resumes"]
    _no_rank_left(run)


@pytest.mark.msrun
def test_seven_interrupted_runs_train_like_one_uninterrupted_run(chain):
    from helpers import reference_run
    from hyperparallel.recipe import load_recipe
    last = chain["last"]
    assert last.code == 0, last.stderr[-2000:]
    with open(os.path.join(chain["run"], "metrics.jsonl")) as f:
        m = [json.loads(line) for line in f]
    assert [r["step"] for r in m] == list(range(1, STEPS + 1))
    want = reference_run(load_recipe(RECIPE), STEPS)[0]
    np.testing.assert_allclose([r["loss"] for r in m], want, rtol=1e-5)
