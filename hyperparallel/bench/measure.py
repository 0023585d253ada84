"""MindSpore-side measurements, run on every rank under msrun (imported only by the bench worker).

* :func:`profile_rank`: per-action compute times of every chunk of the recipe's cut, run by the
  runtime's own :class:`~hyperparallel.mindspore.interpreter.Interpreter` on a one-device program
  (same PyNative mode, blocking launch, tape autograd, bound core and glue code as a real step),
  at the recipe's micro-batches; data-generation time per micro-batch; activation memory kept by
  the tape (RSS growth); and a 2-rank ping-pong through the runtime's own ``Comm``.
* :func:`bench_rank`: the real per-rank program for ``steps`` optimizer steps, with the step time
  split into MindSpore compute (tape forward/backward), gradient accumulation over micro-batches
  (MindSpore adds), communication (waiting included), data generation, optimizer, the loss
  all-reduce, and the interpreter's own time: everything else (dispatch, bookkeeping, and the
  small MindSpore calls it makes itself: cutting the graph at chunk boundaries, ``ones_like``
  seeds, reading the loss), plus resident memory, plus the time other processes used the rank's
  core during the step (:func:`foreign_cpu_s`: tells a clean step from a disturbed one).
"""
from __future__ import annotations

import os
import resource
import time
from types import SimpleNamespace
from typing import Dict, List

import numpy as np

from hyperparallel.mpipe import ir

MB = 1024.0 * 1024.0


def rss_mb() -> float:
    """Current resident set size of this process (MB)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / MB


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (MB; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def cpu_ticks():
    """(busy ticks of the core this process is bound to, this process's own CPU ticks), or None
    when the process may run on several cores (then other ranks share them: nothing to tell).
    Busy = user + nice + system + irq + softirq + steal of ``/proc/stat``; own = utime + stime."""
    try:
        cpus = os.sched_getaffinity(0)
        if len(cpus) != 1:
            return None
        name = f"cpu{next(iter(cpus))}"
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith(name + " "):
                    v = [int(x) for x in line.split()[1:]]
                    busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
                    break
            else:
                return None
        with open("/proc/self/stat") as f:
            st = f.read().rsplit(")", 1)[1].split()
        return busy, int(st[11]) + int(st[12])
    except (OSError, ValueError, IndexError):
        return None


def foreign_cpu_s(before, after) -> float:
    """Seconds of this process's core used by other processes (or the hypervisor) in between."""
    if before is None or after is None:
        return 0.0
    return max(0, (after[0] - before[0]) - (after[1] - before[1])) / os.sysconf("SC_CLK_TCK")


class Stopwatch:
    """Seconds accumulated per category."""

    def __init__(self):
        self.total: Dict[str, float] = {}

    def add(self, cat: str, dt: float) -> None:
        self.total[cat] = self.total.get(cat, 0.0) + dt

    def wrap(self, cat: str, fn):
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.add(cat, time.perf_counter() - t0)
        return timed

    def snapshot(self) -> Dict[str, float]:
        return dict(self.total)


class TimedTape:
    """The interpreter's tape with the time spent inside MindSpore autograd counted as compute."""

    def __init__(self, tape, sw: Stopwatch):
        self.forward = sw.wrap("compute", tape.forward)
        self.no_grad = sw.wrap("compute", tape.no_grad)
        self.grad = sw.wrap("compute", tape.grad)


class TimedSource:
    """The data source with every micro-batch's lazy pixel loading (which runs when the model's
    input chunk first reads it, outside ``Interpreter.micro``) counted as data too."""

    def __init__(self, source, sw: Stopwatch):
        self._source, self._sw = source, sw

    def micro_batch(self, step: int, micro: int):
        mb = self._source.micro_batch(step, micro)
        if hasattr(mb, "wrap_load"):
            mb.wrap_load(lambda load: self._sw.wrap("data", load))
        return mb

    def __getattr__(self, name):
        return getattr(self._source, name)


class TimedComm:
    """The rank's Comm with every communication call counted as comm (waiting included)."""

    TIMED = ("send", "recv", "all_reduce", "broadcast")

    def __init__(self, comm, sw: Stopwatch):
        self._comm = comm
        for name in self.TIMED:
            setattr(self, name, sw.wrap("comm", getattr(comm, name)))

    def __getattr__(self, name):
        return getattr(self._comm, name)


# -- profile ------------------------------------------------------------------------------

def local_plan(plan: ir.Plan, backward: str) -> ir.Plan:
    """A one-device plan holding every chunk of ``plan``; for each micro-batch the forwards in
    data-flow order, then the backwards of the trainable chunks in reverse: fused (``BW``) or
    split (every ``B``, then every ``W``)."""
    chunks = [ir.Chunk(c.region, c.index, c.start, c.stop, (0,)) for c in plan.chunks]
    order = [(c.region, c.index) for c in chunks]  # plan.chunks are in data-flow order
    trained = [k for k in order if plan.trainable.get(k[0], True)]
    prog: List[ir.Action] = []
    for m in range(plan.num_micro):
        prog += [ir.Action(ir.F, r, c, m) for r, c in order]
        if backward == "fused":
            prog += [ir.Action(ir.BW, r, c, m) for r, c in reversed(trained)]
        else:
            prog += [ir.Action(ir.B, r, c, m) for r, c in reversed(trained)]
            prog += [ir.Action(ir.W, r, c, m) for r, c in reversed(trained)]
    return ir.Plan(num_devices=1, num_micro=plan.num_micro, programs={0: prog}, chunks=chunks,
                   schedule=[], trainable=dict(plan.trainable), data_parallel=1)


class ActionClock:
    """Interpreter hook: wall time of every action; a micro-batch's data is generated (and timed)
    before its first action, so no compute time includes it."""

    def __init__(self, interp):
        self.interp = interp
        self.times: List[tuple] = []   # (step, kind, region, chunk, micro, ms)
        self.data_ms: List[float] = []
        self.rss: List[float] = []     # RSS before each action (activation measurement)
        self._open = None

    def close(self) -> None:
        if self._open is not None:
            step, a, t0 = self._open
            self.times.append((step, a.kind, a.region, a.chunk, a.micro, (time.perf_counter() - t0) * 1e3))
            self._open = None

    def __call__(self, step: int, index: int, length: int) -> None:
        self.close()
        a = self.interp.program[index]
        if a.micro is not None:
            n = len(self.interp._mb)
            t0 = time.perf_counter()
            mt = self.interp.micro(a.micro, a.step) if a.step else self.interp.micro(a.micro)
            if (a.region, a.chunk) == (self.interp.regions[0], 0):
                self.interp.model.model_input(mt)   # lazy pixels: loaded (and timed) here, not in the action
            if len(self.interp._mb) > n:  # generated now (not already cached for this step)
                self.data_ms.append((time.perf_counter() - t0) * 1e3)
        self.rss.append(rss_mb())
        self._open = (step, a, time.perf_counter())


def profile_rank(job: dict, comm) -> dict:
    """Measurements of this rank (see module docstring); ``job['plan']`` gives the cut."""
    from hyperparallel.mindspore.config import RunConfig
    from hyperparallel.mindspore.data import data_source
    from hyperparallel.mindspore.interpreter import Interpreter

    plan = ir.Plan.from_json(job["plan"])
    rc = RunConfig.from_raw(job["raw"])
    source = data_source(rc)
    cells = {(c.region, c.index): rc.model.build_chunk(c.region, c.start, c.stop) for c in plan.chunks}
    fake = SimpleNamespace(device=0, dp_index=0, rank=comm.rank)
    steps, warmup, passes = int(job.get("steps", 4)), int(job.get("warmup", 1)), int(job.get("passes", 3))
    out: dict = {"rank": comm.rank, "actions": [], "data_ms": [], "output_bytes": {r: [] for r in plan.regions()}}
    for mode in ("fused", "split"):
        lp = local_plan(plan, mode)
        if mode == "split" and not any(a.kind == ir.B for a in lp.programs[0]):
            continue
        interp = Interpreter(lp, fake, rc.model, source, cells)
        clock = ActionClock(interp)
        interp.hook = clock
        for step in range(warmup):   # first-time kernels of every shape, allocator
            interp.run_step(step)
            clock.close()
        clock.times.clear()
        clock.data_ms.clear()
        # every sampled step ``passes`` times; per (action, micro-batch) the median over the
        # passes (robust to a busy machine), then the mean over micro-batches (the data's mix)
        for _ in range(passes):
            for step in range(steps):
                interp.run_step(step)
                clock.close()
                if mode == "fused" and _ == 0:
                    for _k, (mb, _t) in sorted(interp._mb.items()):   # each region's output size
                        for r in plan.regions():
                            spec = rc.model.boundary(r, rc.model.depth(r), mb)
                            out["output_bytes"][r].append(spec.nbytes)
        per: Dict[tuple, List[float]] = {}
        for s, k, r, c, m, ms in clock.times:
            per.setdefault((s, k, r, c, m), []).append(ms)
        out["actions"] += [dict(mode=mode, kind=k, region=r, chunk=c, micro=m, step=s, ms=float(np.median(v)))
                           for (s, k, r, c, m), v in per.items()]
        if mode == "fused":
            n = len(clock.data_ms) // passes
            out["data_ms"] = [float(np.median(clock.data_ms[i::n])) for i in range(n)] if n else []
    out["activation_mb"] = _activation_mb(plan, rc, source, cells, fake)
    out["param_mb"] = {f"{r}/{c}": sum(int(np.prod(p.shape)) * 4 for p in cell.get_parameters()) / MB
                       for (r, c), cell in cells.items()}
    out["layers"] = {f"{c.region}/{c.index}": c.layers for c in plan.chunks}
    out["output_mb"] = {r: float(np.mean(v or [0])) / MB for r, v in out["output_bytes"].items()}
    comm.barrier()
    out["link"] = ping_pong(comm, job.get("sizes", [4096, 65536, 262144, 1048576, 4194304]),
                            int(job.get("reps", 7))) if comm.world >= 2 else None
    comm.barrier()
    return out


def _activation_mb(plan, rc, source, cells, fake) -> Dict[str, float]:
    """RSS growth per recorded forward (what the tape keeps for backward), MB per chunk,
    averaged over the micro-batches of step 0: all forwards first, then all backwards."""
    from hyperparallel.mindspore.interpreter import Interpreter
    chunks = [ir.Chunk(c.region, c.index, c.start, c.stop, (0,)) for c in plan.chunks]
    order = [(c.region, c.index) for c in chunks]
    trained = [k for k in order if plan.trainable.get(k[0], True)]
    prog = [ir.Action(ir.F, r, c, m) for m in range(plan.num_micro) for r, c in order]
    prog += [ir.Action(ir.BW, r, c, m) for m in range(plan.num_micro) for r, c in reversed(trained)]
    lp = ir.Plan(num_devices=1, num_micro=plan.num_micro, programs={0: prog}, chunks=chunks,
                 trainable=dict(plan.trainable))
    interp = Interpreter(lp, fake, rc.model, source, cells)
    clock = ActionClock(interp)
    interp.hook = clock
    interp.run_step(0)   # warm the allocator
    clock.close()
    clock.rss.clear()
    interp.run_step(0)
    clock.close()
    grow: Dict[str, List[float]] = {}
    n_f = plan.num_micro * len(order)
    for i in range(n_f):
        a = prog[i]
        after = clock.rss[i + 1]
        grow.setdefault(f"{a.region}/{a.chunk}", []).append(max(0.0, after - clock.rss[i]))
    return {k: float(np.mean(v)) for k, v in grow.items()}


def ping_pong(comm, sizes, reps: int) -> dict:
    """Rank 0 <-> rank 1 round trips through Comm.send/recv; one-way time = round trip / 2.
    Returns the points and a least-squares fit of latency + bytes / bandwidth."""
    import mindspore as ms
    from mindspore import ops
    points = []
    if comm.rank > 1:
        return {}
    peer = 1 - comm.rank
    for size in sizes:
        n = max(1, int(size) // 4)
        t = ops.ones((n,), ms.float32)
        one_way, send_host = [], []
        for r in range(reps + 2):
            if comm.rank == 0:
                t0 = time.perf_counter()
                comm.send(t, peer)
                t1 = time.perf_counter()
                comm.recv((n,), peer)
                dt = time.perf_counter() - t0
                if r >= 2:
                    one_way.append(dt / 2 * 1e3)
                    send_host.append((t1 - t0) * 1e3)
            else:
                comm.recv((n,), peer)
                comm.send(t, peer)
        if comm.rank == 0:
            points.append({"bytes": n * 4, "one_way_ms": float(np.median(one_way)),
                           "send_host_ms": float(np.median(send_host))})
    if comm.rank != 0:
        return {}
    x = np.array([p["bytes"] for p in points], float) / MB
    y = np.array([p["one_way_ms"] for p in points], float)
    slope, icpt = np.polyfit(x, y, 1, w=1.0 / y)  # relative error: small messages matter as much
    bw = (1000.0 / 1024.0) / slope if slope > 0 else 0.0  # GB/s: slope is ms per MB
    return {"points": points, "latency_ms": max(0.0, float(icpt)), "bandwidth_gb_s": bw}


# -- bench --------------------------------------------------------------------------------

def bench_rank(case: dict, comm) -> dict:
    """Run the case's real program for ``steps`` steps; per-step time split by category."""
    from hyperparallel.mindspore.optim import Optimizer
    from hyperparallel.mindspore.worker import setup_case

    base_rss = rss_mb()
    plan, rc, chunks, interp = setup_case(case, comm)
    opt = Optimizer(interp.updated, rc.train)
    sw = Stopwatch()
    interp.tape = TimedTape(interp.tape, sw)
    interp.comm = TimedComm(comm, sw)
    interp.micro = sw.wrap("data", interp.micro)
    interp.source = TimedSource(interp.source, sw)
    interp.add_grads = sw.wrap("accumulate", interp.add_grads)
    n_actions = len(interp.program)
    clock = None
    if case.get("action_times"):
        clock = ActionClock(interp)
        interp.hook = clock
    steps = []
    if hasattr(interp, "run_prologue"):
        interp.run_prologue(0)  # next-step (spill) work for the first step; nothing for most plans
    for step in range(int(case["steps"])):
        before = sw.snapshot()
        c0 = cpu_ticks()
        t0 = time.perf_counter()
        part = interp.run_step(step)
        if clock is not None:
            clock.close()
        t1 = time.perf_counter()
        grads = interp.step_grads()
        opt.step(grads)
        t2 = time.perf_counter()
        loss = comm.all_reduce_scalar(part)
        t3 = time.perf_counter()
        foreign = foreign_cpu_s(c0, cpu_ticks())
        after = sw.snapshot()
        d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("compute", "accumulate", "comm", "data")}
        program_s = t1 - t0
        steps.append({"step": step, "step_s": t3 - t0, "program_s": program_s, "compute_s": d["compute"],
                      "accumulate_s": d["accumulate"], "comm_s": d["comm"], "data_s": d["data"], "optimizer_s": t2 - t1, "loss_reduce_s": t3 - t2,
                      "interp_s": max(0.0, program_s - sum(d.values())), "foreign_cpu_s": foreign, "loss": loss})
        if comm.rank == 0:
            print(f"[{case['name']}] step {step + 1}/{case['steps']} loss {loss:.6f} "
                  f"step_time {t3 - t0:.3f}s", flush=True)
    times = [dict(step=st, kind=k, region=r, chunk=c, micro=m, ms=ms) for st, k, r, c, m, ms in clock.times] \
        if clock is not None else None
    return {"rank": comm.rank, "device": comm.device, "n_actions": n_actions, "steps": steps, "action_times": times,
            "base_rss_mb": base_rss, "end_rss_mb": rss_mb(), "peak_rss_mb": peak_rss_mb()}
