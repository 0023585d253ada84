"""Launch a job with msrun and watch it: progress, exit status, failed rank, hang, signals.

No MindSpore import here: the launcher only builds the msrun command, streams
rank 0's progress lines, and on failure names the rank that failed from
``LOG_DIR/worker_N.log``. A watchdog stops the whole job soon after any worker
dies (msrun itself may wait for the survivors, which block in a receive until MCCL's timeout,
:func:`hyperparallel.runtime.compat.comm_timeouts`), and, with ``hang_timeout_s``, when no rank has moved
for that long (the ranks' heartbeats, :mod:`hyperparallel.watch`), naming the rank that stopped.

Signals (preemption): the first SIGTERM/SIGINT/SIGHUP is forwarded to this node's ranks (SIGINT as
SIGINT, so that the ranks' stop line names what was sent; SIGTERM and SIGHUP as SIGTERM), which finish
their step, save it and exit (:mod:`hyperparallel.runtime.stop`); a second signal or
``stop_grace_s`` running out kills them at once. msrun dying under the ranks (SIGTERM to msrun) is
handled the same way. The launcher never returns while a rank it started is alive: msrun starts every
worker in a session of its own, so the ranks are found as msrun's children (``MS_ROLE=MS_WORKER``)
and killed by pid when they outlive the job. A launcher that dies without ending the job (SIGKILL)
leaves nothing either: its guardian process (:class:`Guard`) ends what is left.
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

# the msrun entry, a module run with ``python -m`` (a script's own folder would lead sys.path)
WORKER_SCRIPT = "hyperparallel.runtime.worker"


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

# exit statuses of a launch beyond 0 (done), 1 (a rank failed) and 2 (bad input, nothing launched)
PREEMPTED = 75     # stopped on a signal after a complete step (checkpointed with --save-dir): --resume
SAVE_FAILED = 74   # a checkpoint could not be written (path and OS error named)
# a step's loss or grad norm was NaN/infinite (train.nonfinite: stop), the step named (65, pure Python module)
from .runtime.nonfinite import NONFINITE_EXIT as NONFINITE  # noqa: E402
HUNG = 124         # no rank moved for train.hang_timeout_s (the rank named), or the job's --timeout


def msrun_overrides(world: int) -> Dict[str, str]:
    """msrun flags from ``HP_MSRUN_ARGS`` (multi-node runs: node rank, master address, ...).

    Raises SpecError naming the flag when it is unknown or contradicts the plan's rank count.
    """
    from .errors import SpecError
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
    for key in ("worker_num", "local_worker_num", "master_port", "node_rank", "cluster_time_out"):
        if key in out and not re.fullmatch(r"\d+", out[key]):
            raise SpecError(f"HP_MSRUN_ARGS --{key}", f"must be a whole number, got {out[key]!r}")
    for key in ("join", "bind_core"):
        if key in out and out[key] not in ("True", "False"):
            raise SpecError(f"HP_MSRUN_ARGS --{key}", f"must be True or False, got {out[key]!r}")
    if out.get("join") == "False":
        raise SpecError("HP_MSRUN_ARGS --join", "False is not supported: hyperparallel waits for its ranks (msrun "
                                                "--join=True) to report every step and the result; give True or "
                                                "leave it out")
    if "worker_num" in out and out["worker_num"] != str(world):
        raise SpecError("HP_MSRUN_ARGS --worker_num", f"{out['worker_num']} but the plan needs parallel_config."
                                                      f"pipeline_stage x data_parallel x model_parallel = {world} ranks; "
                                                      f"allowed: {world} (or change those keys)")
    local = int(out.get("local_worker_num", world))
    if not 1 <= local <= world or world % local:
        raise SpecError("HP_MSRUN_ARGS --local_worker_num", f"{local} must divide the job's {world} ranks "
                                                            f"(pipeline_stage x data_parallel x model_parallel) into whole nodes")
    nodes = world // local
    if int(out.get("node_rank", 0)) >= nodes:
        raise SpecError("HP_MSRUN_ARGS --node_rank", f"{out['node_rank']} but {world} ranks of {local} per node make "
                                                     f"{nodes} node(s): 0..{nodes - 1}")
    if "master_port" in out and not 1024 <= int(out["master_port"]) <= 65535:
        raise SpecError("HP_MSRUN_ARGS --master_port", f"must be 1024..65535, got {out['master_port']}")
    return out


def refuse_tensor_parallel(recipe, command: str) -> None:
    """The measuring commands (bench, profile, tune's verify) launch P x D ranks without tensor parallelism: a
    recipe with ``parallel_config.model_parallel`` > 1 is refused before launch (``train`` runs it)."""
    from .errors import SpecError
    if getattr(recipe, "tensor_parallel", 1) > 1:
        raise SpecError("parallel_config.model_parallel", f"{recipe.tensor_parallel}: {command} runs without tensor "
                                                          "parallelism; allowed: 1 (hyperparallel train runs T > 1)")


def local_ranks(world: int, overrides: Dict[str, str]) -> List[int]:
    """The global ranks msrun starts on this node: ``local_worker_num`` of them from ``node_rank x local``."""
    local = int(overrides.get("local_worker_num", world))
    node = int(overrides.get("node_rank", 0))
    return list(range(node * local, node * local + local))


def device_present(device: str) -> bool:
    """Whether this machine has the recipe's device: always for CPU; for Ascend, an NPU device file."""
    import glob
    return device != "Ascend" or bool(glob.glob("/dev/davinci[0-9]*"))


def preflight(world: int, device: str) -> Dict[str, str]:
    """What a launch checks before msrun starts: the device is here, ``HP_MSRUN_ARGS`` fits the plan
    (returns its flags). SpecError naming the key or flag."""
    from .errors import SpecError
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
    program = msrun_path()
    if int(flags.get("node_rank", 0)) > 0 and _is_this_machine(flags.get("master_addr", "127.0.0.1")):
        # another node of the job on node 0's machine: msrun would start a second scheduler (compat.msrun_node)
        program = [sys.executable, "-m", "hyperparallel.runtime.compat"]
    entry = [script] if script.endswith(".py") else ["python", "-m", script]   # a file or a module
    return program + [f"--{k}={v}" for k, v in flags.items()] + entry + [job_path]


def _is_this_machine(addr: str) -> bool:
    """Whether ``addr`` is an address of this machine (loopback, or one its interfaces can bind)."""
    try:
        ip = socket.gethostbyname(addr)
    except OSError:
        return False
    if ip.startswith("127."):
        return True
    try:
        with socket.socket() as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


@dataclass
class LaunchResult:
    returncode: int
    log_dir: str
    message: str = ""
    wall_s: float = 0.0
    lines: List[str] = field(default_factory=list)
    stopped: str = ""     # rank 0's "stopped on signal" line: a clean stop after a step (PREEMPTED)
    killed: str = ""      # why the ranks were killed at once (second signal, grace over)
    hung: str = ""        # the hang verdict
    msrun_gone: bool = False


def _worker_log(log_dir: str, rank: int) -> str:
    return os.path.join(log_dir, f"worker_{rank}.log")


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _rank_pid(text: str) -> Optional[int]:
    """The pid in a worker log's start line (``hyperparallel worker rank R pid P``, written by
    :func:`hyperparallel.runtime.job.start_job`), or None."""
    m = re.search(r"hyperparallel worker rank \S+ pid (\d+)", text)
    return int(m.group(1)) if m else None


def find_failed_rank(log_dir: str, world: int, vanished: Optional[int] = None) -> Optional[int]:
    """The rank that failed first: a fault-injection line, else the first worker msrun
    reports as exited with an exception (PID mapped through the worker's start line),
    else ``vanished`` (the first rank whose process the launcher saw end without finishing its job),
    else a rank whose traceback is not a failed receive, else any rank with a traceback."""
    texts = {r: _read(_worker_log(log_dir, r)) for r in range(world)}
    for r, t in texts.items():
        if "fault injection: rank" in t:
            return r
    pids = {pid: r for r, pid in ((r, _rank_pid(t)) for r, t in texts.items()) if pid is not None}
    for m in re.finditer(r"Worker process (\d+) exit", _read(os.path.join(log_dir, "msrun.log"))):
        if int(m.group(1)) in pids:
            return pids[int(m.group(1))]
    if vanished is not None:
        return vanished
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
    pid = _rank_pid(_read(_worker_log(log_dir, rank)))
    if pid is None:
        return ""
    for line in _read(os.path.join(log_dir, "msrun.log")).splitlines():
        if f"Worker process {pid} exit" in line:
            return line[line.index("Worker process"):].strip()
    return ""


def _progress(line: str) -> bool:
    """Rank 0's lines the console shows: steps, the run's settings and parameters, checkpoint saves and resumes."""
    from .runtime.nonfinite import NONFINITE
    if line.startswith(NONFINITE):   # reported once, in the error line
        return False
    return (" step " in line or "job finished" in line or "resumed" in line or line.startswith("saved ")
            or "] optimizer " in line or "] data: " in line or "] train.nonfinite" in line
            or "] parameters: " in line)


class _Signals:
    """SIGTERM / SIGINT / SIGHUP to the launcher, counted (installed for one launch, then restored)."""

    NAMES = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self):
        self.got: List[int] = []
        self._old = {}

    def install(self) -> "_Signals":
        import threading
        if threading.current_thread() is threading.main_thread():
            for s in self.NAMES:
                self._old[s] = signal.signal(s, self._on)
        return self

    def _on(self, signum, frame) -> None:
        self.got.append(signum)

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def _forwarded(signum: int) -> int:
    """The signal a rank gets for the launcher's first one: SIGINT stays SIGINT (the ranks' stop line then
    names it); SIGTERM, and SIGHUP (on a rank it means msrun is gone), reach the ranks as SIGTERM."""
    return signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM


def _stat(pid: int):
    """(parent pid, state, start time, process group) of a process from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[1]), rest[0], int(rest[19]), int(rest[2])
    except (OSError, IndexError, ValueError):
        return None


def _role(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for kv in f.read().split(b"\0"):
                if kv.startswith(b"MS_ROLE="):
                    return kv[8:].decode()
    except OSError:
        pass
    return ""


def _runs(pid: int, path: str) -> bool:
    """Whether the process's command line holds ``path`` (a rank runs the job file; msrun's log tails do not)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return path.encode() in f.read()
    except OSError:
        return False


def _children(pid: int) -> List[int]:
    out = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if name.isdigit():
            st = _stat(int(name))
            if st and st[0] == pid:
                out.append(int(name))
    return out


def _alive(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] != "Z" and st[2] == start


class _Ranks:
    """The ranks msrun started on this node, by pid (msrun's children with ``MS_ROLE=MS_WORKER`` that run the
    job file), kept after msrun is gone; a recorded start time guards against a reused pid."""

    def __init__(self, msrun_pid: int, job_path: str):
        self.msrun, self.job_path = msrun_pid, job_path
        self.pids: Dict[int, int] = {}       # pid -> start time
        self.others: Dict[int, int] = {}     # msrun's other children (its scheduler)

    def refresh(self) -> None:
        """Classify msrun's children. A child not (yet) seen as a rank is looked at again on every refresh:
        between msrun's fork and its exec a rank still has msrun's command line and environment, and on
        a loaded machine a refresh lands in that window (a rank taken for good as "other" would leave
        the node's ranks never all seen, and a finished job judged hung)."""
        for pid in _children(self.msrun):
            st = _stat(pid)
            if not st or pid in self.pids:
                continue
            if _role(pid) == "MS_WORKER" and _runs(pid, self.job_path):
                self.others.pop(pid, None)
                self.pids[pid] = st[2]
            else:
                self.others[pid] = st[2]

    def alive(self) -> List[int]:
        return [p for p, t in self.pids.items() if _alive(p, t)]

    def signal(self, sig: int, pids=None) -> None:
        for p in (self.alive() if pids is None else pids):
            try:
                os.kill(p, sig)
            except OSError:
                pass

    def kill_all(self, wait_s: float = 10.0) -> None:
        """SIGKILL every rank and msrun's other children still alive; wait until they are gone."""
        deadline = time.time() + wait_s
        while True:
            left = self.alive() + [p for p, t in self.others.items() if _alive(p, t)]
            if not left or time.time() > deadline:
                return
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.05)


def _die_with_parent() -> None:
    """In msrun, before exec: SIGTERM when the launcher dies, even by SIGKILL (msrun's death then reaches
    the ranks as SIGHUP, and they stop after their step)."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _rank_line(log_dir: str, ranks, prefix: str) -> str:
    """The rest of the first line starting with ``prefix`` in the worker logs of ``ranks`` (in that
    order), or ''."""
    for r in ranks:
        for line in _read(_worker_log(log_dir, r)).splitlines():
            if line.startswith(prefix):
                return line[len(prefix):].strip()
    return ""


def _stop_line(log_dir: str, ranks: List[int]) -> str:
    """A rank's ``stopped on signal: ...`` line (rank 0's, if this node has it), or ''."""
    from .runtime.stop import STOPPED
    return _rank_line(log_dir, ranks, STOPPED)


def _nonfinite_stop(log_dir: str, world: int) -> str:
    """The ranks' line about a step stopped for a NaN/infinite loss or grad norm ('' when none)."""
    from .runtime.nonfinite import NONFINITE
    return _rank_line(log_dir, range(world), NONFINITE)


def _save_failure(log_dir: str, world: int) -> str:
    """A rank's line about a checkpoint it could not write ('' when none)."""
    from .runtime.ckpt_files import SAVE_FAILED
    return _rank_line(log_dir, range(world), SAVE_FAILED)


def _fresh_log_dir(log_dir: str) -> None:
    """The log folder made, with a previous run's worker logs, beats, done files and guardian report
    removed: msrun appends to old worker logs, and a previous run's lines would mislead."""
    os.makedirs(log_dir, exist_ok=True)
    for name in os.listdir(log_dir):
        if re.match(r"(worker_\d+\.log|progress_\d+\.json|done_\d+|launcher_gone\.log)$", name):
            os.remove(os.path.join(log_dir, name))


def _job_env(log_dir: str) -> Dict[str, str]:
    """msrun's environment: this interpreter's ``python`` and this repository first, quiet MindSpore logs."""
    env = dict(os.environ, GLOG_v="3", PYTHONUNBUFFERED="1")
    # MindFormers writes its logs under $LOCAL_DEFAULT_PATH (default ./output): keep them with the job's
    env.setdefault("LOCAL_DEFAULT_PATH", os.path.join(os.path.abspath(log_dir), "mindformers"))
    # msrun starts workers with the "python" on PATH: make it this interpreter's (the venv's)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def launch(job: dict, world: int, log_dir: str, timeout_s: float = 3600, echo: bool = True,
           grace_s: float = 2.0, script: str = WORKER_SCRIPT, hang_timeout_s: Optional[float] = None,
           stop_grace_s: float = 30.0) -> LaunchResult:
    """Run the job on ``world`` ranks; returns when it ends, fails, hangs, is stopped or times out, and
    never while a rank it started is alive (see the module docstring).

    ``script``: the msrun entry, a module or a ``.py`` file (default the training worker; ``hyperparallel bench``
    and ``hyperparallel profile`` pass their own). ``grace_s``: once a rank is seen dead (its traceback, a
    fault line, msrun's report of its exit, or its process gone without its done file), how long its last
    lines get to reach the logs before every rank is stopped. ``hang_timeout_s``: the hang verdict on the ranks'
    heartbeats (None: off; only the training worker beats). ``stop_grace_s``: after a first signal, how
    long the ranks get to finish their step and save."""
    overrides = msrun_overrides(world)
    log_dir = overrides.get("log_dir", log_dir)  # HP_MSRUN_ARGS may move the logs
    _fresh_log_dir(log_dir)
    job = dict(job, stop_grace_s=stop_grace_s)
    job_path = os.path.join(log_dir, "job.json")
    with open(job_path, "w") as f:
        json.dump(job, f)
    env = _job_env(log_dir)
    cmd = msrun_command(job_path, world, log_dir, free_port(), overrides, script)
    watch = _Watch(job, world, log_dir, overrides, timeout_s=timeout_s, echo=echo, grace_s=grace_s,
                   hang_timeout_s=hang_timeout_s, stop_grace_s=stop_grace_s)
    watch.sigs.install()
    watch.t0 = time.time()
    with open(os.path.join(log_dir, "msrun.log"), "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=_die_with_parent)
    guard = Guard.start(proc.pid, job_path, stop_grace_s + GUARD_MARGIN_S, log_dir, env)
    watch.proc, watch.ranks = proc, _Ranks(proc.pid, job_path)
    try:
        watch.poll()
    finally:
        _end(proc, watch.ranks)
        guard.release()
        watch.sigs.restore()
    return watch.classify()


_WAIT, _STOP = "wait", "stop"   # what a poll-loop check decides: poll again now / the job's end is known


class _Watch:
    """One launched job watched to its end. :meth:`poll` runs the loop: every 0.2 s rank 0's new lines are
    echoed and each check (one method per event: a signal, msrun gone, every rank done, a rank dead, a
    hang, the watchdog) may end it; :meth:`classify` then gives the verdict (one method each: preempted,
    save failure, non-finite, missing nodes, failed rank, hang, killed) with its message and exit status."""

    def __init__(self, job: dict, world: int, log_dir: str, overrides: Dict[str, str], timeout_s: float,
                 echo: bool, grace_s: float, hang_timeout_s: Optional[float], stop_grace_s: float):
        self.job, self.world, self.log_dir, self.overrides = job, world, log_dir, overrides
        self.timeout_s, self.echo, self.grace_s = timeout_s, echo, grace_s
        self.hang_timeout_s, self.stop_grace_s = hang_timeout_s, stop_grace_s
        self.mine = local_ranks(world, overrides)
        self.sigs = _Signals()
        self.res = LaunchResult(returncode=0, log_dir=log_dir)
        self.proc: Optional[subprocess.Popen] = None
        self.ranks: Optional[_Ranks] = None
        self.t0 = 0.0
        self.pos, self.death_seen, self.stop_at, self.told, self.last_scan = 0, None, None, set(), 0.0
        self.vanished: Optional[int] = None

    # -- the poll loop ----------------------------------------------------------------------------------
    def poll(self) -> None:
        """Poll msrun, the ranks and the logs until one check ends the watch."""
        while True:
            rc = self.proc.poll()
            now = time.time()
            if rc is None and now - self.last_scan > 0.5:
                self.ranks.refresh()
                self.last_scan = now
            # every rank of this node finished its job: its last line written, only MindSpore's teardown
            # left (checked before the log is read, so that the read holds their last lines)
            finished = rc is None and _all_done(self.log_dir, self.mine, self.ranks)
            self._read_rank0()
            alive = self.ranks.alive()
            if self.sigs.got and self.signalled(now, alive) == _STOP:
                break
            if rc is not None:
                if self.msrun_ended(rc, now, alive) == _WAIT:
                    time.sleep(0.2)
                    continue
                break
            if finished and not self.sigs.got:
                self.done()
                break
            self.watch_deaths(now)
            if self.hung(now) == _STOP or self.watchdog(now) == _STOP:
                break
            time.sleep(0.2)

    def _read_rank0(self) -> None:
        """Rank 0's new log lines kept (``res.lines``); its progress lines echoed."""
        text = _read(_worker_log(self.log_dir, 0))
        new, self.pos = text[self.pos:], len(text)
        for line in new.splitlines():
            if "[WARNING]" in line or "[INFO]" in line or not line.strip():
                continue
            self.res.lines.append(line)
            if self.echo and _progress(line):
                print(line, flush=True)

    def signalled(self, now: float, alive: List[int]) -> Optional[str]:
        """Preemption: every rank finishes its step and saves, within stop_grace_s; a second signal or the
        grace running out kills them at once (stop)."""
        sigs, res = self.sigs, self.res
        if self.stop_at is None:
            self.stop_at = now + self.stop_grace_s
            name = signal.Signals(sigs.got[0]).name
            print(f"{name}: every rank finishes its step{' and saves it' if _saves(self.job) else ''}, then "
                  f"exits (up to {self.stop_grace_s:g} s; a second signal stops at once)", file=sys.stderr,
                  flush=True)
        fresh = [p for p in alive if p not in self.told]
        self.ranks.signal(_forwarded(sigs.got[0]), fresh)   # ranks that start after the signal get it too
        self.told.update(fresh)
        if len(sigs.got) > 1 or now > self.stop_at:
            why = (f"second signal ({signal.Signals(sigs.got[1]).name})" if len(sigs.got) > 1
                   else f"the {self.stop_grace_s:g} s grace ran out")
            res.killed = f"stopped at once: {why}; every rank killed"
            res.returncode = 128 + sigs.got[-1]
            return _STOP
        return None

    def msrun_ended(self, rc: int, now: float, alive: List[int]) -> str:
        """msrun exited. Its ranks still running after a failure (SIGTERM to msrun: they got SIGHUP and stop
        after their step) are waited for as for a signal to the launcher (wait); else its status is the
        job's, and ranks still there past the grace are killed (stop)."""
        res = self.res
        if alive and rc != 0 and (self.stop_at is None or now <= self.stop_at):
            if self.stop_at is None:
                self.stop_at = now + self.stop_grace_s
                print(f"msrun ended (status {rc}) with {len(alive)} rank(s) running: they finish their "
                      f"step and exit (up to {self.stop_grace_s:g} s)", file=sys.stderr, flush=True)
                res.msrun_gone = True
            return _WAIT
        if alive:
            res.killed = f"msrun ended and the ranks did not stop within {self.stop_grace_s:g} s; killed"
        res.returncode = rc
        return _STOP

    def done(self) -> None:
        """Every rank of this node is done: the ranks' teardown (1-2 s) and msrun's scheduler, which polls
        for their exit every 5 s (see runtime.job.end_job), add nothing: end msrun and the ranks now
        (_end), status 0."""
        self.res.returncode = 0

    def watch_deaths(self, now: float) -> None:
        """Notes when a rank is first seen dead: its traceback or fault line, or its process gone without
        its done file (``vanished``)."""
        if self.death_seen is None and self.stop_at is None and self.vanished is None:
            self.vanished = _vanished(self.log_dir, self.mine, self.ranks)
        if self.death_seen is None and (find_failed_rank(self.log_dir, self.world) is not None
                                        or self.vanished is not None):
            self.death_seen = now

    def hung(self, now: float) -> Optional[str]:
        """The heartbeats' hang verdict (with ``hang_timeout_s``, while no signal and no death): stop, HUNG."""
        if self.hang_timeout_s and self.stop_at is None and self.death_seen is None:
            verdict = _hang(self.log_dir, self.mine, self.ranks, self.hang_timeout_s, now)
            if verdict:
                self.res.hung, self.res.returncode = verdict, HUNG
                return _STOP
        return None

    def watchdog(self, now: float) -> Optional[str]:
        """A dead rank leaves its peers blocked: stop the job grace_s after the death (status 1), or at the
        job's timeout (HUNG)."""
        if (self.death_seen is not None and now - self.death_seen > self.grace_s) or now - self.t0 > self.timeout_s:
            self.res.returncode = 1
            if now - self.t0 > self.timeout_s and self.death_seen is None:
                self.res.message, self.res.returncode = f"job timed out after {self.timeout_s:.0f} s", HUNG
            return _STOP
        return None

    # -- the verdict ------------------------------------------------------------------------------------
    def classify(self) -> LaunchResult:
        """The job's result once every process is gone: exit status and message of the first verdict
        that holds."""
        res = self.res
        res.wall_s = time.time() - self.t0
        res.stopped = _stop_line(self.log_dir, self.mine)
        self.signal_too_early()
        if res.stopped and not res.killed and not res.hung:
            return self.preempted()
        if res.returncode < 0:   # msrun killed by a signal
            res.returncode = 128 - res.returncode
        if res.returncode != 0 and not res.killed and not res.hung:
            return self.save_failed() or self.non_finite() or self.nodes_missing() or self.rank_failed()
        if res.hung:
            res.message = f"{res.hung} (logs: {self.log_dir}/worker_<rank>.log)"
        elif res.killed:
            res.message = res.killed
        return res

    def signal_too_early(self) -> None:
        """A signal before the ranks could act on it (e.g. while they started): they did not stop cleanly."""
        res, got = self.res, self.sigs.got
        if got and not res.stopped and not res.killed and res.returncode != 0:
            res.killed = f"{signal.Signals(got[0]).name} before the ranks could stop after a step; every rank stopped"
            res.returncode = 128 + got[0]

    def preempted(self) -> LaunchResult:
        """The ranks stopped cleanly after a step on a signal: PREEMPTED (resume with --resume)."""
        self.res.returncode = PREEMPTED
        return self.res

    def save_failed(self) -> Optional[LaunchResult]:
        """A rank could not write a checkpoint: SAVE_FAILED, its line."""
        saving = _save_failure(self.log_dir, self.world)
        if not saving:
            return None
        self.res.returncode, self.res.message = SAVE_FAILED, f"checkpoint save failed: {saving}"
        return self.res

    def non_finite(self) -> Optional[LaunchResult]:
        """A step stopped for a NaN/infinite loss or grad norm: NONFINITE, the ranks' line."""
        bad = _nonfinite_stop(self.log_dir, self.world)
        if not bad:
            return None
        self.res.returncode, self.res.message = NONFINITE, f"non-finite {bad}"
        return self.res

    def nodes_missing(self) -> Optional[LaunchResult]:
        """A multi-node cluster that never formed: the nodes that never joined."""
        missing = _missing_nodes(self.log_dir, self.world, self.overrides)
        if not missing:
            return None
        self.res.message = missing
        return self.res

    def rank_failed(self) -> LaunchResult:
        """The failed rank and its last error line (or msrun's report of it), else msrun's status."""
        res = self.res
        rank = find_failed_rank(self.log_dir, self.world, self.vanished)
        if rank is not None:
            why = (_last_error_line(_read(_worker_log(self.log_dir, rank))) or _msrun_report(self.log_dir, rank)
                   or "died without a message")
            res.message = f"rank {rank} failed: {why} (log: {_worker_log(self.log_dir, rank)})"
        elif not res.message:
            res.message = f"msrun exited with status {res.returncode} (logs in {self.log_dir})"
        return res


CLUSTER_FAILED = "Failed to initialize distributed job cluster"   # MindSpore's init() when the cluster never formed


def _missing_nodes(log_dir: str, world: int, overrides: Dict[str, str]) -> str:
    """On a multi-node job whose cluster never formed (this node's ranks failed in ``init()``): which other
    nodes never joined, or '' (one node, or another failure)."""
    local = int(overrides.get("local_worker_num", world))
    if local >= world:
        return ""
    mine = local_ranks(world, overrides)
    if not any(CLUSTER_FAILED in _read(_worker_log(log_dir, r)) for r in mine):
        return ""
    node, nodes = int(overrides.get("node_rank", 0)), world // local
    others = [k for k in range(nodes) if k != node]
    span = lambda k: f"ranks {k * local}-{k * local + local - 1}" if local > 1 else f"rank {k * local}"  # noqa: E731
    names = "; ".join(f"node {k} ({span(k)})" for k in others)
    where = f"{overrides.get('master_addr', '127.0.0.1')}:{overrides.get('master_port', '?')}"
    who = f"{names} never joined" if len(others) == 1 else f"of {names}, at least one never joined"
    return (f"{who} within --cluster_time_out {overrides.get('cluster_time_out', '600')} s (node {node} waited "
            f"at {where}; start every node with the same --worker_num, --master_addr and --master_port) "
            f"(logs: {log_dir})")


def _saves(job: dict) -> bool:
    return any(c.get("save_dir") for c in job.get("cases", []))


def _hang(log_dir: str, mine: List[int], ranks: "_Ranks", timeout_s: float, now: float) -> str:
    from .watch import hang_verdict, read_beats
    beats = read_beats(log_dir)
    return hang_verdict(beats, timeout_s, now, mine, _states(beats, ranks)) or ""


def _states(beats: Dict[int, dict], ranks: "_Ranks") -> Dict[int, str]:
    """{rank: the ``/proc`` state of its process} for the heartbeats whose pid is a rank this launch started
    (still alive: a pid reused by another process is not asked)."""
    out = {}
    for r, b in beats.items():
        pid = b.get("pid")
        st = _stat(pid) if pid in ranks.pids else None
        if st and st[2] == ranks.pids[pid]:
            out[r] = st[1]
    return out


def _vanished(log_dir: str, mine: List[int], ranks: "_Ranks") -> Optional[int]:
    """A rank of this node whose process is gone without its ``done_<rank>`` file: it died (an error, a
    kill, a refused input) -- seen at once, not when msrun's own check reports it seconds later. A rank
    that stops on a signal still passes the job's end barrier and leaves its done file."""
    for r in mine:
        if os.path.exists(os.path.join(log_dir, f"done_{r}")):
            continue
        pid = _rank_pid(_read(_worker_log(log_dir, r)))
        if pid in ranks.pids and not _alive(pid, ranks.pids[pid]):
            return r
    return None


def _all_done(log_dir: str, mine: List[int], ranks: "_Ranks") -> bool:
    """Every rank of this node started (msrun's children seen) and left its ``done_<rank>`` file."""
    return (len(ranks.pids) >= len(mine) > 0
            and all(os.path.exists(os.path.join(log_dir, f"done_{r}")) for r in mine))


def _end(proc, ranks: "_Ranks") -> None:
    """msrun and every process it started gone (killed when still there), before the launch returns."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)   # msrun and its scheduler (the ranks have sessions of their own)
        except OSError:
            pass
        proc.wait()
    ranks.kill_all()


# -- the guardian: nothing of a job outlives its launcher, even a SIGKILLed one -----------------------------

GUARD_MARGIN_S = 10.0   # past the ranks' own grace (stop_grace_s + 5 s, runtime.worker) before the guardian kills
GUARD_REPORT = "launcher_gone.log"


class Guard:
    """A small process beside the launcher that cleans up after it when it dies without doing so itself
    (SIGKILL, the OOM killer). It holds the read end of a pipe whose write end only the launcher has: the
    launcher writes one byte when it has ended the job; end of file without it means the launcher is gone.

    Why a process of its own: msrun starts ``tail -f LOG_DIR/worker_N.log`` log followers as children in
    its process group and kills them only on its own clean end, a worker's failure or SIGINT -- not on the
    SIGTERM its parent-death signal (:func:`_die_with_parent`) brings, and a parent-death signal does not
    reach msrun's children; nor does anything wait for msrun's scheduler or for a rank that cannot stop.
    The guardian lets the ranks stop after their step as they do when msrun dies (SIGHUP,
    :mod:`hyperparallel.runtime.stop`), for up to ``grace_s``, then SIGKILLs what is left of the job:
    msrun's process group (msrun, its scheduler, its log followers) and the job's ranks."""

    def __init__(self, proc: Optional[subprocess.Popen], fd: int):
        self.proc, self.fd = proc, fd

    @staticmethod
    def start(msrun_pid: int, job_path: str, grace_s: float, log_dir: str, env: Dict[str, str]) -> "Guard":
        r, w = os.pipe()   # both ends close-on-exec: msrun and the ranks never hold the write end
        try:
            proc = subprocess.Popen([sys.executable, "-m", "hyperparallel.launch", "guard", str(msrun_pid),
                                     job_path, f"{grace_s:g}", log_dir], stdin=r, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, env=env, start_new_session=True)
        except OSError:
            os.close(w)
            return Guard(None, -1)
        finally:
            os.close(r)
        return Guard(proc, w)

    def release(self) -> None:
        """The launcher ended the job itself: the guardian exits without touching anything."""
        if self.proc is None:
            return
        try:
            os.write(self.fd, b"x")
        except OSError:
            pass
        os.close(self.fd)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _ticks_now() -> int:
    """Now, in the clock ticks since boot that ``/proc/<pid>/stat`` gives a process's start time in."""
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK"))


def job_processes(msrun_pid: int, job_path: str, born_by: int, role: str = "") -> List[int]:
    """The live processes of a job, started no later than ``born_by`` (ticks; a later launch on the same job
    file is not this job): msrun's process group (msrun leads one) and the processes with an ``MS_ROLE``
    that run the job file (the ranks, which msrun puts in sessions of their own, and its scheduler).
    With ``role``, only the processes of that ``MS_ROLE``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        pid = int(name)
        st = _stat(pid)
        if not st or st[1] == "Z" or st[2] > born_by:
            continue
        if role:
            ours = _runs(pid, job_path) and _role(pid) == role
        else:
            ours = st[3] == msrun_pid or (_runs(pid, job_path) and bool(_role(pid)))
        if ours:
            out.append(pid)
    return out


def sweep(msrun_pid: int, job_path: str, grace_s: float) -> List[int]:
    """What the guardian does once the launcher is gone: wait up to ``grace_s`` for the job's ranks to end,
    then SIGKILL every process of the job still there (:func:`job_processes`); returns their pids."""
    born_by = _ticks_now() + os.sysconf("SC_CLK_TCK")   # msrun may be forking a rank right now
    deadline = time.time() + grace_s
    while time.time() < deadline and job_processes(msrun_pid, job_path, born_by, role="MS_WORKER"):
        time.sleep(0.2)
    killed: List[int] = []
    for _ in range(200):
        left = job_processes(msrun_pid, job_path, born_by)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
            if pid not in killed:
                killed.append(pid)
        time.sleep(0.05)
    return killed


def _guard_main(msrun_pid: int, job_path: str, grace_s: float, log_dir: str) -> int:
    """The guardian process (:class:`Guard`): block until the launcher writes its byte or dies."""
    for s in (signal.SIGINT, signal.SIGHUP):   # a terminal's signals are the launcher's to act on
        signal.signal(s, signal.SIG_IGN)
    launcher = os.getppid()
    if os.read(0, 1):
        return 0
    t0 = time.time()
    try:
        killed = sweep(msrun_pid, job_path, grace_s)
        why = f"killed {len(killed)} left: pids {', '.join(map(str, killed))}" if killed else "nothing left to kill"
    except Exception as e:   # noqa: BLE001 -- the report is all there is to say it
        why = f"cleanup failed: {type(e).__name__}: {e}"
    with open(os.path.join(log_dir, GUARD_REPORT), "a") as f:
        f.write(f"the launcher (pid {launcher}) is gone without ending the job: the ranks had up to {grace_s:g} s "
                f"to stop after their step ({time.time() - t0:.1f} s taken); {why}\n")
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["guard"]:
    sys.exit(_guard_main(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5]))
