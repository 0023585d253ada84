"""What a user has is not lost (issue 41): ``train`` refuses, before launch, a save dir holding another run's
checkpoints, a run or save dir another run holds (its lock), a resume with nothing left to train and a bad
``metrics.jsonl`` line; a partial last line of ``metrics.jsonl`` (a full disk) is left out with a note.

No msrun job: every case here is refused before launch, or calls the function that decides. The save
directories hold hand-made step directories in the layout :mod:`hyperparallel.runtime.ckpt_files`
checks (``.ckpt`` files, whose content the launcher does not read; digests and marker as a save writes them).
"""
import argparse
import json
import os
import socket
import subprocess
import sys

import pytest

from hyperparallel import runlock
from hyperparallel.runtime import ckpt_files as cf
from hyperparallel.errors import SpecError

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "tiny_mllm.yaml")


def train(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "hyperparallel", "train", RECIPE, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def make_step(save_dir, step, complete=True):
    """A step directory as a save leaves it (one rank file, meta.json with its digest, the marker)."""
    d = cf.step_dir(str(save_dir), step)
    os.makedirs(d)
    f = os.path.join(d, "rank_0.ckpt")
    with open(f, "wb") as fh:
        fh.write(os.urandom(64) + bytes([step]))
    meta = {"format_version": 1, "format": "ckpt", "step": step, "files": ["rank_0.ckpt"], "schedule": "transpose",
            "P": 2, "V": 1, "D": 1, "digests": {"rank_0.ckpt": cf.file_record(f)},
            "data_position": {"next_step": step, "micro_batch": 0, "micro_batches_per_step": 4, "step": step}}
    with open(os.path.join(d, cf.META), "w") as fh:
        json.dump(meta, fh)
    if complete:
        with open(os.path.join(d, cf.MARKER), "w") as fh:
            json.dump({"step": step, "files": meta["files"],
                       "meta_sha256": cf.file_digest(os.path.join(d, cf.META))}, fh)
    assert cf.is_complete(d) == complete
    return d


def snapshot(folder):
    """{relative path: bytes} of every file under ``folder``."""
    out = {}
    for root, _, files in os.walk(folder):
        for n in files:
            p = os.path.join(root, n)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder)] = fh.read()
    return out


def one_error(p):
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr
    return lines[0]


@pytest.fixture
def old_run(tmp_path):
    """A save dir with another run's complete step_3 and step_6, and a run dir."""
    save = tmp_path / "ckpt"
    make_step(save, 3)
    make_step(save, 6)
    return str(save), str(tmp_path / "run")


# -- 1. a save dir holding complete steps ---------------------------------------------------------------------

def test_save_dir_with_complete_steps_refused_without_resume(old_run):
    save, run = old_run
    before = snapshot(save)
    err = one_error(train("--save-dir", save, "--run-dir", run, "--steps", "2"))
    assert err == (f"error: --save-dir: {save} already holds complete checkpoints (step_6, step_3) that this run "
                   f"would mix with its own; continue them with --resume, give --overwrite-save-dir to remove them "
                   f"first, or give another --save-dir"), err
    assert snapshot(save) == before   # nothing overwritten
    assert not os.path.exists(os.path.join(run, "logs"))   # nothing launched
    assert not os.path.exists(os.path.join(run, runlock.LOCK)) and not os.path.exists(os.path.join(save, runlock.LOCK))


def test_resume_from_an_older_step_refused_when_newer_ones_are_there(old_run):
    save, run = old_run
    err = one_error(train("--save-dir", save, "--run-dir", run, "--resume-from", os.path.join(save, "step_3"),
                          "--steps", "8"))
    assert err.startswith(f"error: --save-dir: {save} holds complete checkpoints after step 3, where --resume-from "
                          f"starts (step_6): a later --resume would take them for this run's; give "
                          f"--overwrite-save-dir"), err


def test_resume_and_overwrite_together_refused(old_run):
    save, run = old_run
    err = one_error(train("--save-dir", save, "--run-dir", run, "--resume", "--overwrite-save-dir", "--steps", "8"))
    assert err.startswith("error: --overwrite-save-dir: give either --resume"), err


def _args(save, **kw):
    a = dict(save_dir=save, reference=False, resume=False, resume_from=None, overwrite_save_dir=False, source=None)
    a.update(kw)
    return argparse.Namespace(**a)


def test_overwrite_removes_the_old_step_directories_only(old_run, capsys):
    from hyperparallel.commands.train import _guard_save_dir
    save, _ = old_run
    make_step(save, 7, complete=False)   # an incomplete one goes too (nothing of the old run stays)
    with open(os.path.join(save, "notes.txt"), "w") as fh:
        fh.write("mine")
    _guard_save_dir(_args(save, overwrite_save_dir=True), node0=False)   # another node: removes nothing
    assert len(cf.step_dirs(save)) == 3
    _guard_save_dir(_args(save, overwrite_save_dir=True), node0=True)
    assert cf.step_dirs(save) == [] and sorted(os.listdir(save)) == ["notes.txt"]
    out = capsys.readouterr().out.strip()
    assert out == (f"--overwrite-save-dir: removed 3 step directories of an earlier run from {save} "
                   f"(step_7, step_6, step_3)"), out
    _guard_save_dir(_args(save), node0=True)   # now empty: no refusal


def test_overwrite_with_resume_from_keeps_the_source_and_older_steps(old_run):
    from hyperparallel.commands.train import _guard_save_dir
    save, _ = old_run
    make_step(save, 2)
    src = cf.resolve(os.path.join(save, "step_3"))
    with pytest.raises(SpecError, match=r"^--save-dir: .* after step 3, where --resume-from starts \(step_6\)"):
        _guard_save_dir(_args(save, resume_from=src.path, source=src), node0=True)
    _guard_save_dir(_args(save, resume_from=src.path, source=src, overwrite_save_dir=True), node0=True)
    assert [s for s, _ in cf.list_steps(save)[0]] == [3, 2]
    # a file inside a step the overwrite would remove: refused, nothing removed
    make_step(save, 9)
    f = cf.resolve(os.path.join(save, "step_9", "rank_0.ckpt"))
    with pytest.raises(SpecError, match=r"^--overwrite-save-dir: would remove .*step_9, which --resume-from reads"):
        _guard_save_dir(_args(save, resume_from=f.path, source=f, overwrite_save_dir=True), node0=True)
    assert [s for s, _ in cf.list_steps(save)[0]] == [9, 3, 2]


def test_resume_continues_the_save_dir_and_incomplete_steps_alone_are_no_refusal(old_run, tmp_path):
    from hyperparallel.commands.train import _guard_save_dir
    save, _ = old_run
    src = cf.resolve(save)
    _guard_save_dir(_args(save, resume=True, source=src), node0=True)   # its own run: no refusal, nothing removed
    assert [s for s, _ in cf.list_steps(save)[0]] == [6, 3]
    fresh = str(tmp_path / "fresh")
    make_step(fresh, 2, complete=False)   # a first run that died before any complete save
    _guard_save_dir(_args(fresh), node0=True)
    assert cf.step_dirs(fresh)


# -- 3. nothing left to train ---------------------------------------------------------------------------------

@pytest.mark.parametrize("steps", ["4", "6"])
def test_resume_at_or_past_the_last_step_refused_naming_steps(old_run, steps):
    save, run = old_run
    err = one_error(train("--save-dir", save, "--run-dir", run, "--resume", "--steps", steps))
    assert err == (f"error: --steps: the run ends at step {steps} (--steps), but {os.path.join(save, 'step_6')} is "
                   f"already at step 6: nothing left to train; give --steps above 6"), err
    assert not os.path.exists(os.path.join(run, "logs"))
    err = one_error(train("--resume-from", os.path.join(save, "step_3"), "--run-dir", run, "--steps", "3",
                          "--set", "train.steps=3"))
    assert "--steps: the run ends at step 3 (--steps), but " in err and "nothing left to train" in err


def test_resume_with_train_steps_names_where_the_count_came_from(old_run):
    save, run = old_run
    err = one_error(train("--save-dir", save, "--run-dir", run, "--resume", "--set", "train.steps=5"))
    assert err.startswith("error: --steps: the run ends at step 5 (train.steps), but "), err


# -- 2. one run at a time per run dir / save dir -----------------------------------------------------------------

def write_lock(folder, pid, host=None, name=runlock.LOCK):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    rec = {"pid": pid, "host": host or socket.gethostname(), "pid_start": runlock._pid_start(pid),
           "started": "2030-01-01 00:00:00 +0000", "command": "hyperparallel train first.yaml", "token": "x"}
    with open(path, "w") as fh:
        json.dump(rec, fh)
    return path


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("flag", ["--run-dir", "--save-dir"])
def test_directory_held_by_a_running_run_refused_naming_it(tmp_path, flag):
    run, save = str(tmp_path / "run"), str(tmp_path / "ckpt")
    lock = write_lock(run if flag == "--run-dir" else save, os.getpid())   # this test: a live process
    with open(lock) as fh:
        before = fh.read()
    err = one_error(train("--run-dir", run, "--save-dir", save, "--steps", "2"))
    held = run if flag == "--run-dir" else save
    assert err == (f"error: {flag}: {held} is in use by another run (pid {os.getpid()} on {socket.gethostname()}, "
                   f"started 2030-01-01 00:00:00 +0000: hyperparallel train first.yaml); wait for it to end or give "
                   f"another {flag}"), err
    with open(lock) as fh:
        assert fh.read() == before   # the holder's lock is left alone
    assert not os.path.exists(os.path.join(run, "logs"))
    other = [f for f in os.listdir(run if flag == "--save-dir" else save) if f.startswith(".hyperparallel")]
    assert other == []   # the other directory's lock, taken first or not, is released


def test_lock_of_another_host_refused_with_the_file_to_remove(tmp_path):
    run = str(tmp_path / "run")
    lock = write_lock(run, 12345, host="some-other-host")
    err = one_error(train("--run-dir", run, "--steps", "2"))
    assert err.startswith(f"error: --run-dir: {run} is in use by another run (pid 12345 on some-other-host, "), err
    assert err.endswith(f"this host cannot tell whether it still runs: if it does not, remove {lock}"), err


def test_stale_lock_taken_over_with_a_note_and_released_on_refusal(old_run):
    save, run = old_run
    pid = dead_pid()
    lock = write_lock(run, pid)
    p = train("--save-dir", save, "--run-dir", run, "--steps", "2")   # refused afterwards: its save dir
    assert one_error(p).startswith("error: --save-dir: "), p.stderr
    notes = [ln for ln in p.stdout.splitlines() if "stale lock" in ln]
    assert notes == [f"note: --run-dir: took over the stale lock {lock} (pid {pid} on {socket.gethostname()}, "
                     f"started 2030-01-01 00:00:00 +0000, is no longer running)"], p.stdout
    assert not os.path.exists(lock) and not os.path.exists(os.path.join(save, runlock.LOCK))   # released


def test_lock_of_a_reused_pid_is_stale(tmp_path):
    """This very process or a process with the recorded pid but another start time: not the holder."""
    d = str(tmp_path / "d")
    write_lock(d, os.getpid())
    assert runlock.holder_running(json.load(open(os.path.join(d, runlock.LOCK)))) is False
    rec = {"pid": os.getppid(), "host": socket.gethostname(), "pid_start": "1"}
    assert runlock.holder_running(rec) is False
    rec["pid_start"] = runlock._pid_start(os.getppid())
    assert runlock.holder_running(rec) is True


def test_lock_released_on_error_and_on_sigterm(tmp_path):
    d = str(tmp_path / "d")
    os.makedirs(d)
    with pytest.raises(RuntimeError):
        with runlock.holding([("--run-dir", d), ("--save-dir", d)]) as locks:   # one directory, one lock
            assert len(locks) == 1 and os.path.exists(os.path.join(d, runlock.LOCK))
            with pytest.raises(SpecError, match="is in use by another run"):
                runlock.DirLock("--save-dir", d).acquire()
            raise RuntimeError("a failed run")
    assert os.listdir(d) == []
    code = ("import os, signal, sys; from hyperparallel import runlock\n"
            "with runlock.holding([('--run-dir', sys.argv[1])]):\n"
            "    print('held', flush=True); os.kill(os.getpid(), signal.SIGTERM)\n"
            "print('not reached')\n")
    p = subprocess.run([sys.executable, "-c", code, d], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 143 and p.stdout == "held\n", (p.returncode, p.stdout, p.stderr)
    assert os.listdir(d) == []


def test_nodes_of_one_job_have_locks_of_their_own(tmp_path):
    d = str(tmp_path / "shared")
    os.makedirs(d)
    with runlock.holding([("--save-dir", d)], node=0):
        with runlock.holding([("--save-dir", d)], node=1):
            assert sorted(os.listdir(d)) == [".hyperparallel.lock", ".hyperparallel.node1.lock"]
    assert os.listdir(d) == []


# -- 4. metrics.jsonl read on resume ---------------------------------------------------------------------------

def _metrics_file(run, *lines):
    os.makedirs(run, exist_ok=True)
    path = os.path.join(run, "metrics.jsonl")
    with open(path, "w") as fh:
        fh.write("".join(lines))
    return path


def test_partial_last_metrics_line_left_out_with_a_note(tmp_path, capsys):
    from hyperparallel.runtime.worker import open_metrics
    path = _metrics_file(str(tmp_path), '{"step": 1, "loss": 2.5}\n', '{"step": 2, "loss": 2.4}\n',
                         '{"step": 3, "loss": 2.')   # the disk filled up mid-line
    f = open_metrics(path, 2)
    f.write('{"step": 3, "loss": 2.3}\n')
    f.close()
    assert capsys.readouterr().out == (f"note: {path}: its last line 3 is cut short (Expecting ',' delimiter; e.g. "
                                       f"a full disk): left out\n")
    with open(path) as fh:
        assert [json.loads(line)["step"] for line in fh] == [1, 2, 3]


def test_metrics_line_without_its_newline_is_kept_whole(tmp_path):
    from hyperparallel.runtime.worker import open_metrics
    path = _metrics_file(str(tmp_path), '{"step": 1, "loss": 2.5}\n', '{"step": 2, "loss": 2.4}')
    f = open_metrics(path, 2)
    f.write('{"step": 3, "loss": 2.3}\n')
    f.close()
    with open(path) as fh:
        assert [json.loads(line)["step"] for line in fh] == [1, 2, 3]


def test_bad_metrics_line_before_the_last_refused_before_launch(old_run):
    save, run = old_run
    path = _metrics_file(run, '{"step": 1}\n', '{"step": 2, "lo\n', '{"step": 3}\n')
    err = one_error(train("--save-dir", save, "--run-dir", run, "--resume", "--steps", "8"))
    assert err.startswith(f"error: {path} line 2: not a JSON line ("), err
    assert err.endswith("); fix or remove that line"), err
    assert not os.path.exists(os.path.join(run, "logs"))
    from hyperparallel.runtime.worker import open_metrics
    with pytest.raises(SpecError, match=r"metrics.jsonl line 2: not a JSON line"):
        open_metrics(path, 2)
