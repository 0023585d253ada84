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

    def __init__(self, tape, sw: Stopwatch, clock: "BusyClock" = None):
        w = clock.wrap if clock is not None else (lambda fn: fn)
        self.forward = sw.wrap("compute", w(tape.forward))
        self.no_grad = sw.wrap("compute", w(tape.no_grad))
        self.grad = sw.wrap("compute", w(tape.grad))


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
    """The rank's Comm with every communication call counted as comm (waiting included).

    Point-to-point calls are also logged as ``[op, peer global rank, host_from, enter, exit]``
    (``time.perf_counter``: one clock for every process of a machine): ``host_from`` is when this
    rank's previous compute or communication call ended (or the step began), so
    ``enter - host_from`` is host work (interpreter, data) done just before the call. The bench
    pairs every send with its receive (:func:`hyperparallel.bench.bench.host_stalls`) to find
    where one rank waited on the other's host work."""

    TIMED = ("send", "recv", "all_reduce", "broadcast")

    def __init__(self, comm, sw: Stopwatch, clock: "BusyClock" = None):
        self._comm = comm
        self.p2p: List[list] = []
        self._clock = clock
        for name in self.TIMED:
            setattr(self, name, sw.wrap("comm", self._logged(name, getattr(comm, name))))

    def _logged(self, name, fn):
        clock = self._clock
        if clock is None:
            return fn
        if name not in ("send", "recv"):
            return clock.wrap(fn)

        def call(*a, **k):
            peer = self._comm.global_rank(a[1])
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                t1 = time.perf_counter()
                self.p2p.append([name, peer, clock.last_end, t0, t1])
                clock.last_end = t1
        return call

    def __getattr__(self, name):
        return getattr(self._comm, name)


class BusyClock:
    """When this rank's last compute or communication call ended (see :class:`TimedComm`)."""

    def __init__(self):
        self.last_end = time.perf_counter()

    def wrap(self, fn):
        def call(*a, **k):
            try:
                return fn(*a, **k)
            finally:
                self.last_end = time.perf_counter()
        return call


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

    def __init__(self, interp, rss: bool = True):
        self.interp, self.record_rss = interp, rss
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
        if self.record_rss:
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
    from .machine import this_machine
    out: dict = {"rank": comm.rank, "actions": [], "data_ms": [], "output_bytes": {r: [] for r in plan.regions()},
                 "machine": this_machine(rc.device)}
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

class CaseRunner:
    """One bench case on this rank: its real program, stepped one optimizer step at a time, with the
    step time split by category (see the module docstring)."""

    def __init__(self, case: dict, comm):
        from hyperparallel.mindspore.optim import Optimizer
        from hyperparallel.mindspore.worker import setup_case

        self.case, self.comm = case, comm
        self.base_rss = rss_mb()
        plan, rc, chunks, interp = setup_case(case, comm)
        self.interp, self.opt = interp, Optimizer(interp.updated, rc.train)
        self.sw, self.busy = Stopwatch(), BusyClock()
        interp.tape = TimedTape(interp.tape, self.sw, self.busy)
        interp.comm = self.tcomm = TimedComm(comm, self.sw, self.busy)
        interp.micro = self.sw.wrap("data", interp.micro)
        interp.source = TimedSource(interp.source, self.sw)
        interp.add_grads = self.sw.wrap("accumulate", interp.add_grads)
        self.clock = None
        if case.get("action_times"):
            self.clock = ActionClock(interp, rss=False)
            interp.hook = self.clock
        self.steps: List[dict] = []
        interp.run_prologue(0)  # next-step (spill) work for the first step; nothing for most plans

    def step(self, step: int) -> None:
        interp, comm, sw = self.interp, self.comm, self.sw
        before = sw.snapshot()
        c0 = cpu_ticks()
        t0 = self.busy.last_end = time.perf_counter()
        self.tcomm.p2p = []
        part = interp.run_step(step)
        if self.clock is not None:
            self.clock.close()
        t1 = time.perf_counter()
        self.opt.step(interp.step_grads())
        t2 = time.perf_counter()
        loss = comm.all_reduce_scalar(part)
        t3 = time.perf_counter()
        foreign = foreign_cpu_s(c0, cpu_ticks())
        after = sw.snapshot()
        d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("compute", "accumulate", "comm", "data")}
        program_s = t1 - t0
        self.steps.append({"step": step, "step_s": t3 - t0, "program_s": program_s, "compute_s": d["compute"],
                           "accumulate_s": d["accumulate"], "comm_s": d["comm"], "data_s": d["data"],
                           "optimizer_s": t2 - t1, "loss_reduce_s": t3 - t2,
                           "interp_s": max(0.0, program_s - sum(d.values())), "foreign_cpu_s": foreign,
                           "loss": loss, "p2p": self.tcomm.p2p})
        if comm.rank == 0:
            print(f"[{self.case['name']}] step {step + 1}/{self.case['steps']} loss {loss:.6f} "
                  f"step_time {t3 - t0:.3f}s", flush=True)

    def result(self, shared_process: bool = False) -> dict:
        """``shared_process``: other cases ran in this process too, so its memory is not this case's."""
        times = [dict(step=st, kind=k, region=r, chunk=c, micro=m, ms=ms)
                 for st, k, r, c, m, ms in self.clock.times] if self.clock is not None else None
        mem = (None, None, None) if shared_process else (self.base_rss, rss_mb(), peak_rss_mb())
        return {"rank": self.comm.rank, "device": self.comm.device, "n_actions": len(self.interp.program),
                "steps": self.steps, "action_times": times,
                "base_rss_mb": mem[0], "end_rss_mb": mem[1], "peak_rss_mb": mem[2]}


def bench_rank(case: dict, comm) -> dict:
    """Run the case's real program for ``steps`` steps; per-step time split by category."""
    runner = CaseRunner(case, comm)
    for step in range(int(case["steps"])):
        runner.step(step)
    return runner.result()


def bench_rotation(cases: List[dict], comm) -> List[dict]:
    """Several cases in one launch, stepped in rotation (step 0 of A, B, C, then step 1 of A, B, C ...):
    every schedule meets the same phases of a machine whose speed drifts, seconds apart instead of a
    launch apart. Each case keeps its own Cells, data source, optimizer and tape."""
    runners = [CaseRunner(c, comm) for c in cases]
    for step in range(max(int(c["steps"]) for c in cases)):
        for r in runners:
            if step < int(r.case["steps"]):
                r.step(step)
    return [r.result(shared_process=len(runners) > 1) for r in runners]
