"""MindSpore-side measurements, run on every rank under msrun (imported only by the bench worker), all
through explicit interpreter hooks (:class:`TimingHooks`, :class:`ActionClock`):

* :func:`profile_rank`: per-action times of every chunk of the recipe's cut on a one-device program
  derived from the cut, data time per micro-batch, activation memory (RSS growth), a 2-rank ping-pong;
* :class:`CaseRunner`: a schedule's real program, step by step, the step time split into compute,
  gradient accumulation, communication, data, optimizer, loss all-reduce and the interpreter's own
  time, plus resident memory, the rank's memory record of every step (:mod:`hyperparallel.runtime.memory`)
  and the time other processes used the rank's core (:func:`foreign_cpu_s`).
"""
from __future__ import annotations

import os
import resource
import time
from typing import Dict, List

import numpy as np

from hyperparallel.runtime.hooks import Chain, Hooks
from hyperparallel.runtime.memory import rank_memory
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


class TimingHooks(Hooks):
    """Interpreter hooks that add up the seconds spent in its callables per category (``total``:
    compute, comm, data, accumulate) and log every point-to-point call as ``[op, peer global rank,
    host_from, enter, exit]`` (``time.perf_counter``: one clock for every process of a machine).
    ``host_from`` is when this rank's previous compute or communication call ended (or the step
    began), so ``enter - host_from`` is host work (interpreter, data) done just before the call. The
    bench pairs every send with its receive (:func:`hyperparallel.bench.bench.host_stalls`) to find
    where one rank waited on the other's host work."""

    def __init__(self, comm):
        self.comm, self.total, self.p2p, self.last_end = comm, {}, [], time.perf_counter()

    def wrap(self, category, name, fn):
        busy, p2p = category in ("compute", "comm"), name if name in ("send", "recv") else None

        def call(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                t1 = time.perf_counter()
                self.total[category] = self.total.get(category, 0.0) + t1 - t0
                if p2p:
                    self.p2p.append([p2p, self.comm.global_rank(a[1]), self.last_end, t0, t1])
                if busy:
                    self.last_end = t1
        return call


# -- profile ------------------------------------------------------------------------------

UNIT_COSTS = dict(forward_ms=1.0, backward_ms=1.0, weight_ms=1.0, activation_mb=1.0, output_mb=1.0, param_mb=1.0)


def local_plan(plan: ir.Plan, order: str) -> ir.Plan:
    """``plan``'s cut on one device, derived by the algebra: the regions before the pipelined one placed
    on device 0, the pipelined region's chunks (the same layers) all on device 0 in ``order``:
    ``interleaved`` (per micro-batch the forwards, then the fused backwards), ``interleaved_zb`` (the
    same with B and W split), ``gpipe`` (every forward, then every backward)."""
    from hyperparallel.mpipe.derive import derive
    from hyperparallel.mpipe.profile import parse_profile
    regions = plan.regions()
    layers = {r: [c.layers for c in sorted(plan.chunks, key=lambda c: c.index) if c.region == r] for r in regions}
    prof = parse_profile({"regions": [dict(name=r, layers=sum(layers[r]), trainable=plan.trainable.get(r, True),
                                           **UNIT_COSTS) for r in regions]})
    sched = [{"region": r, "skeleton": "place"} for r in regions[:-1]]
    sched.append({"region": regions[-1], "skeleton": "pipe", "order": order, "layers": layers[regions[-1]]})
    return derive(prof, sched, 1, plan.num_micro, len(layers[regions[-1]]))


class ActionClock(Hooks):
    """Interpreter hook: wall time of every action; a micro-batch's data is built (and timed) before
    its first action (:meth:`~hyperparallel.runtime.interpreter.Interpreter.prepare`), so no compute
    time includes it. ``rss``: also the resident memory before each action (activation measurement)."""

    def __init__(self, rss: bool = True):
        self.record_rss = rss
        self.times: List[tuple] = []   # (step, kind, region, chunk, micro, ms)
        self.data_ms: List[float] = []
        self.rss: List[float] = []
        self._open = None

    def close(self) -> None:
        if self._open is not None:
            step, a, t0 = self._open
            self.times.append((step, a.kind, a.region, a.chunk, a.micro, (time.perf_counter() - t0) * 1e3))
            self._open = None

    def before_action(self, interp, step, index, action) -> None:
        self.close()
        t0 = time.perf_counter()
        if interp.prepare(action):   # built now (not already cached for this step)
            self.data_ms.append((time.perf_counter() - t0) * 1e3)
        if self.record_rss:
            self.rss.append(rss_mb())
        self._open = (step, action, time.perf_counter())


LOCAL_ORDERS = {"fused": "interleaved", "split": "interleaved_zb"}   # the tight loop's backward modes


def profile_rank(job: dict, comm) -> dict:
    """Measurements of this rank (see module docstring); ``job['plan']`` gives the cut."""
    from hyperparallel.runtime.comm import LocalComm
    from hyperparallel.runtime.rank import RankRuntime
    from hyperparallel.runconfig import parse_recipe

    plan = ir.Plan.from_json(job["plan"])
    rc = parse_recipe(job["raw"]).run
    source = rc.source()
    cells = {(c.region, c.index): rc.model.build_chunk(c.region, c.start, c.stop) for c in plan.chunks}
    local = LocalComm(comm.rank)
    steps, warmup, passes = int(job.get("steps", 4)), int(job.get("warmup", 1)), int(job.get("passes", 3))
    from ..machine import this_machine
    out: dict = {"rank": comm.rank, "actions": [], "data_ms": [], "output_bytes": {r: [] for r in plan.regions()},
                 "machine": this_machine(rc.device)}
    for mode, order in LOCAL_ORDERS.items():
        lp = local_plan(plan, order)
        if mode == "split" and not any(a.kind == ir.B for a in lp.programs[0]):
            continue
        clock = ActionClock()
        interp = RankRuntime(lp, rc.model, source, rc.train, local, clock, chunks=cells, compile=rc.compile,
                             compile_fallback=rc.compile_fallback, log=None).interp
        for step in range(warmup):   # first-time kernels of every shape, allocator
            interp.run_step(step)
            clock.close()
        clock.times.clear()
        clock.data_ms.clear()
        # every sampled step ``passes`` times; per (action, micro-batch) the median over the
        # passes (robust to a busy machine), then the mean over micro-batches (the data's mix)
        for p in range(passes):
            for step in range(steps):
                interp.run_step(step)
                clock.close()
                if mode == "fused" and p == 0:
                    for mb in interp.micro_batches().values():   # each region's output size
                        for r in plan.regions():
                            out["output_bytes"][r].append(rc.model.boundary(r, rc.model.depth(r), mb).nbytes)
        per: Dict[tuple, List[float]] = {}
        for st, k, r, c, m, ms in clock.times:
            per.setdefault((st, k, r, c, m), []).append(ms)
        out["actions"] += [dict(mode=mode, kind=k, region=r, chunk=c, micro=m, step=st, ms=float(np.median(v)),
                                passes_ms=[float(x) for x in v])   # each pass's time: the profile's spread
                           for (st, k, r, c, m), v in per.items()]
        if mode == "fused":
            n = len(clock.data_ms) // passes
            out["data_ms"] = [float(np.median(clock.data_ms[i::n])) for i in range(n)] if n else []
    out["activation_mb"] = _activation_mb(plan, rc, source, cells, local)
    out["param_mb"] = {f"{r}/{c}": sum(int(np.prod(p.shape)) * 4 for p in cell.get_parameters()) / MB
                       for (r, c), cell in cells.items()}
    # of the chunks with weights that tensor parallelism splits, the part every rank of the group keeps whole
    split = rc.model.tensor_parallel_split(2)
    out["whole_param_mb"] = {f"{r}/{c}": sum(int(np.prod(p.shape)) * 4 for p in cell.get_parameters()
                                             if p.name not in split) / MB
                             for (r, c), cell in cells.items() if any(p.name in split for p in cell.get_parameters())}
    out["layers"] = {f"{c.region}/{c.index}": c.layers for c in plan.chunks}
    out["output_mb"] = {r: float(np.mean(v or [0])) / MB for r, v in out["output_bytes"].items()}
    comm.barrier()
    out["link"] = ping_pong(comm, job.get("sizes", [4096, 65536, 262144, 1048576, 4194304]),
                            int(job.get("reps", 7))) if comm.world >= 2 else None
    comm.barrier()
    return out


def _activation_mb(plan, rc, source, cells, local) -> Dict[str, float]:
    """RSS growth per recorded forward (what the tape keeps for backward), MB per chunk,
    averaged over the micro-batches of step 0: every forward first, then every backward (the
    one-device gpipe of the plan's cut)."""
    from hyperparallel.runtime.rank import RankRuntime
    lp = local_plan(plan, "gpipe")
    clock = ActionClock()
    interp = RankRuntime(lp, rc.model, source, rc.train, local, clock, chunks=cells, compile=rc.compile,
                         compile_fallback=rc.compile_fallback, log=None).interp
    interp.run_step(0)   # warm the allocator
    clock.close()
    clock.rss.clear()
    interp.run_step(0)
    clock.close()
    grow: Dict[str, List[float]] = {}
    prog = lp.programs[0]
    for i, a in enumerate(prog[:-1]):
        if a.kind == ir.F:
            grow.setdefault(f"{a.region}/{a.chunk}", []).append(max(0.0, clock.rss[i + 1] - clock.rss[i]))
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
    """One bench case on this rank: its real program on a rank runtime, stepped one optimizer step at a
    time, with the step time split by category (see the module docstring)."""

    def __init__(self, case: dict, comm):
        from hyperparallel.runtime.job import case_runtime

        self.case, self.comm = case, comm
        self.base_rss = rss_mb()
        self.timing = TimingHooks(comm)
        self.clock = ActionClock(rss=False) if case.get("action_times") else None
        _, self.rt = case_runtime(case, comm, Chain([self.timing, self.clock]))
        self.steps: List[dict] = []

    def step(self, step: int) -> None:
        before = dict(self.timing.total)
        c0 = cpu_ticks()
        self.timing.last_end = time.perf_counter()
        self.timing.p2p = []
        res = self.rt.step(step)
        if self.clock is not None:
            self.clock.close()
        foreign = foreign_cpu_s(c0, cpu_ticks())
        after = self.timing.total
        d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("compute", "accumulate", "comm", "data")}
        self.steps.append({"step": step, "step_s": res.step_s, "program_s": res.program_s, "compute_s": d["compute"],
                           "accumulate_s": d["accumulate"], "comm_s": d["comm"], "data_s": d["data"],
                           "optimizer_s": res.optimizer_s, "loss_reduce_s": res.loss_reduce_s,
                           "interp_s": max(0.0, res.program_s - sum(d.values())), "foreign_cpu_s": foreign,
                           "loss": res.loss, "p2p": self.timing.p2p, "memory": rank_memory(self.rt, res.grads),
                           "compiles": res.compiles, "compile_s": res.compile_s})
        if self.comm.rank == 0:
            print(f"[{self.case['name']}] step {step + 1}/{self.case['steps']} loss {res.loss:.6f} "
                  f"step_time {res.step_s:.3f}s", flush=True)

    def result(self, shared_process: bool = False) -> dict:
        """``shared_process``: other cases ran in this process too, so its memory is not this case's."""
        times = [dict(step=st, kind=k, region=r, chunk=c, micro=m, ms=ms)
                 for st, k, r, c, m, ms in self.clock.times] if self.clock is not None else None
        mem = (None, None, None) if shared_process else (self.base_rss, rss_mb(), peak_rss_mb())
        return {"rank": self.comm.rank, "device": self.comm.device, "n_actions": len(self.rt.interp.program),
                "steps": self.steps, "action_times": times, "compile": self.rt.compile_stats(),
                "base_rss_mb": mem[0], "end_rss_mb": mem[1], "peak_rss_mb": mem[2]}


def bench_rotation(cases: List[dict], comm) -> List[dict]:
    """The cases of one launch, stepped in rotation (step 0 of A, B, C, then step 1 of A, B, C ...): every
    schedule meets the same phases of a machine whose speed drifts, seconds apart instead of a launch
    apart. Each case keeps its own Cells, data source, optimizer and tape."""
    runners = [CaseRunner(c, comm) for c in cases]
    for step in range(max(int(c["steps"]) for c in cases)):
        for r in runners:
            if step < int(r.case["steps"]):
                r.step(step)
    return [r.result(shared_process=len(runners) > 1) for r in runners]
