"""Launch a job with msrun and watch it: progress, exit status, failed rank.

No MindSpore import here: the launcher only builds the msrun command, streams
rank 0's progress lines, and on failure names the rank that failed from
``LOG_DIR/worker_N.log``. A watchdog stops the whole job soon after any worker
dies (msrun itself may wait for the survivors, which block in a receive for
~30 s before MCCL gives up).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mindspore", "worker.py")


def free_port() -> int:
    """A free TCP port from the OS (every launch gets its own master port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def msrun_path() -> List[str]:
    """The msrun of the running interpreter's environment (the venv's, not the PATH's)."""
    cand = os.path.join(os.path.dirname(sys.executable), "msrun")
    return [cand] if os.path.exists(cand) else [sys.executable, "-m", "mindspore.parallel.cluster.run"]


MSRUN_FLAGS = ("worker_num", "local_worker_num", "master_addr", "master_port", "node_rank", "log_dir",
               "join", "cluster_time_out", "bind_core")


def msrun_overrides(world: int) -> Dict[str, str]:
    """msrun flags from ``HP_MSRUN_ARGS`` (multi-node runs: node rank, master address, ...).

    Raises SpecError naming the flag when it is unknown or contradicts the plan's rank count.
    """
    from .mpipe.errors import SpecError
    out: Dict[str, str] = {}
    words = shlex.split(os.environ.get("HP_MSRUN_ARGS", ""))
    i = 0
    while i < len(words):
        w = words[i]
        if not w.startswith("--"):
            raise SpecError("HP_MSRUN_ARGS", f"expected --flag=value, got {w!r}")
        key, eq, val = w[2:].partition("=")
        if not eq:
            if i + 1 >= len(words):
                raise SpecError(f"HP_MSRUN_ARGS --{key}", "missing value")
            val, i = words[i + 1], i + 1
        if key not in MSRUN_FLAGS:
            raise SpecError(f"HP_MSRUN_ARGS --{key}", f"unknown; allowed: {', '.join(MSRUN_FLAGS)}")
        out[key] = val
        i += 1
    if "worker_num" in out and out["worker_num"] != str(world):
        raise SpecError("HP_MSRUN_ARGS --worker_num", f"{out['worker_num']} but the plan needs "
                                                      f"pipeline_stage x data_parallel = {world} ranks")
    return out


def device_present(device: str) -> bool:
    """Whether this machine has the recipe's device: always for CPU; for Ascend, an NPU device file."""
    import glob
    return device != "Ascend" or bool(glob.glob("/dev/davinci[0-9]*"))


def preflight(world: int, device: str) -> Dict[str, str]:
    """What a launch checks before msrun starts: the device is here, ``HP_MSRUN_ARGS`` fits the plan
    (returns its flags). SpecError naming the key or flag."""
    from .mpipe.errors import SpecError
    if not device_present(device):
        raise SpecError("device", f"{device}, but this machine has no {device} device (/dev/davinci*): run it on an "
                                  "Ascend machine; plan and simulate work here (and train with --set device=CPU where "
                                  "the model fits)")
    return msrun_overrides(world)


def msrun_command(job_path: str, world: int, log_dir: str, port: int,
                  overrides: Optional[Dict[str, str]] = None, script: str = WORKER_SCRIPT) -> List[str]:
    flags = {"worker_num": str(world), "local_worker_num": str(world), "master_port": str(port),
             "log_dir": log_dir, "join": "True"}
    # one core per rank when there are enough (unbound ranks fight over cores: 1.3-2x slower);
    # msrun silently ignores the binding when ranks outnumber cores
    if world <= (os.cpu_count() or 1):
        flags["bind_core"] = "True"
    flags.update(overrides or {})
    return msrun_path() + [f"--{k}={v}" for k, v in flags.items()] + [script, job_path]


@dataclass
class LaunchResult:
    returncode: int
    log_dir: str
    failed_rank: Optional[int] = None
    message: str = ""
    wall_s: float = 0.0
    lines: List[str] = field(default_factory=list)


def _worker_log(log_dir: str, rank: int) -> str:
    return os.path.join(log_dir, f"worker_{rank}.log")


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def find_failed_rank(log_dir: str, world: int) -> Optional[int]:
    """The rank that failed first: a fault-injection line, else the first worker msrun
    reports as exited with an exception (PID mapped through the worker's start line),
    else a rank whose traceback is not a failed receive, else any rank with a traceback."""
    texts = {r: _read(_worker_log(log_dir, r)) for r in range(world)}
    for r, t in texts.items():
        if "fault injection: rank" in t:
            return r
    pids = {}
    for r, t in texts.items():
        m = re.search(r"hyperparallel worker rank \S+ pid (\d+)", t)
        if m:
            pids[int(m.group(1))] = r
    for m in re.finditer(r"Worker process (\d+) exit", _read(os.path.join(log_dir, "msrun.log"))):
        if int(m.group(1)) in pids:
            return pids[int(m.group(1))]
    for r, t in texts.items():
        if "Traceback" in t and "Recv failed" not in t:
            return r
    for r, t in texts.items():
        if "Traceback" in t:
            return r
    return None


def _last_error_line(text: str) -> str:
    lines = [l for l in text.splitlines() if l.strip() and "[WARNING]" not in l and "[INFO]" not in l]
    for l in reversed(lines):
        if re.match(r"^\w*(Error|Exception|SystemExit)\b", l) or "fault injection" in l:
            return l.strip()[:300]
    return ""


def _msrun_report(log_dir: str, rank: int) -> str:
    """msrun's own line about this rank's process (exit code), if any."""
    m = re.search(r"hyperparallel worker rank \S+ pid (\d+)", _read(_worker_log(log_dir, rank)))
    if not m:
        return ""
    for line in _read(os.path.join(log_dir, "msrun.log")).splitlines():
        if f"Worker process {m.group(1)} exit" in line:
            return line[line.index("Worker process"):].strip()
    return ""


def _progress(line: str) -> bool:
    """Rank 0's lines the console shows: steps, the run's settings, checkpoint saves and resumes."""
    return (" step " in line or "job finished" in line or "resumed" in line or line.startswith("saved ")
            or "] optimizer " in line or "] data: " in line)


def launch(job: dict, world: int, log_dir: str, timeout_s: float = 3600, echo: bool = True,
           grace_s: float = 15.0, script: str = WORKER_SCRIPT) -> LaunchResult:
    """Run the job on ``world`` ranks; returns when it ends, fails or times out.

    ``script``: the msrun entry (default the training worker; ``hyperparallel bench``
    and ``hyperparallel profile`` pass their own)."""
    overrides = msrun_overrides(world)
    log_dir = overrides.get("log_dir", log_dir)  # HP_MSRUN_ARGS may move the logs
    os.makedirs(log_dir, exist_ok=True)
    for name in os.listdir(log_dir):  # msrun appends to old worker logs: a previous run's lines would mislead
        if re.match(r"worker_\d+\.log$", name):
            os.remove(os.path.join(log_dir, name))
    job_path = os.path.join(log_dir, "job.json")
    with open(job_path, "w") as f:
        json.dump(job, f)
    env = dict(os.environ, GLOG_v="3", PYTHONUNBUFFERED="1")
    # MindFormers writes its logs under $LOCAL_DEFAULT_PATH (default ./output): keep them with the job's
    env.setdefault("LOCAL_DEFAULT_PATH", os.path.join(os.path.abspath(log_dir), "mindformers"))
    # msrun starts workers with the "python" on PATH: make it this interpreter's (the venv's)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = msrun_command(job_path, world, log_dir, free_port(), overrides, script)
    t0 = time.time()
    with open(os.path.join(log_dir, "msrun.log"), "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    res = LaunchResult(returncode=0, log_dir=log_dir)
    pos, death_seen = 0, None
    while True:
        rc = proc.poll()
        text = _read(_worker_log(log_dir, 0))
        new, pos = text[pos:], len(text)
        for line in new.splitlines():
            if "[WARNING]" in line or "[INFO]" in line or not line.strip():
                continue
            res.lines.append(line)
            if echo and _progress(line):
                print(line, flush=True)
        if rc is not None:
            res.returncode = rc
            break
        now = time.time()
        if death_seen is None and find_failed_rank(log_dir, world) is not None:
            death_seen = now
        # watchdog: a dead rank leaves its peers blocked; stop the job after a grace period
        if (death_seen is not None and now - death_seen > grace_s) or now - t0 > timeout_s:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            res.returncode = proc.returncode or 1
            if now - t0 > timeout_s and death_seen is None:
                res.message = f"job timed out after {timeout_s:.0f} s"
            break
        time.sleep(0.2)
    res.wall_s = time.time() - t0
    if res.returncode != 0:
        res.returncode = res.returncode if res.returncode > 0 else 1
        rank = find_failed_rank(log_dir, world)
        res.failed_rank = rank
        if rank is not None:
            why = (_last_error_line(_read(_worker_log(log_dir, rank))) or _msrun_report(log_dir, rank)
                   or "died without a message")
            res.message = f"rank {rank} failed: {why} (log: {_worker_log(log_dir, rank)})"
        elif not res.message:
            res.message = f"msrun exited with status {res.returncode} (logs in {log_dir})"
    return res
