"""msrun entry of ``tools/bare_loop.py``: one rank runs either the runtime or a hand-written loop.

``msrun ... tools/bare_loop_worker.py JOB.json`` with ``JOB.json`` =
``{"mode": "runtime" | "bare" | "both", "schedule": "1f1b" | "transpose", "raw": recipe, "plan": plan
JSON, "steps": N, "out_dir": DIR, "first": "runtime" | "bare"}``; every rank writes
``DIR/rank_N.json`` (with ``both``: ``DIR/runtime/`` and ``DIR/bare/``, the two alternating step by
step in one process) with its step times and losses.

Both modes build the same chunk Cells (the recipe's adapter, the plan's cut), read the same data
source, use the same ``Comm``, tape autograd and optimizer, and time a step the same way (program,
optimizer, loss all-reduce), with no instrumentation inside the step. ``runtime`` runs the derived
program through the rank runtime (:class:`~hyperparallel.runtime.rank.RankRuntime`); ``bare`` runs the minimal
hand-written loop below: what an engineer would write for this one schedule, with nothing
model- or plan-generic in the step. It is the yardstick of the interpreter's overhead, not a
second runtime: it knows only 1F1B (V=1) and round-robin transpose with a frozen first region.
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # run as a script by msrun: import the package from the repository root
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))

import json
import time


class BareLoop:
    """Hand-written 1F1B (and round-robin transpose) for one rank."""

    def __init__(self, plan, rc, comm, source, cells, bodies):
        """``bodies``: each chunk's forward as the runtime runs it (compiled under ``mpipe.compile: jit``,
        :mod:`hyperparallel.runtime.compiled`): the bare loop runs the same bodies."""
        from hyperparallel.runtime.compat import Tape
        self.plan, self.rc, self.comm, self.source, self.tape = plan, rc, comm, source, Tape
        self.bodies = bodies
        self.d, self.P, self.M = comm.device, plan.num_devices, plan.num_micro
        self.model = rc.model
        first = plan.regions()[0]
        self.enc = None
        if schedule_of(plan) == "transpose":
            enc = [c for c in plan.chunks if c.region == first]
            if len(enc) != 1 or plan.trainable.get(first, True):
                raise SystemExit("bare transpose loop: needs a frozen first region in one replicated chunk")
            self.enc = (enc[0], bodies[(first, 0)])
        # this rank's pipeline stage: its chunks of the pipelined regions, in data-flow order
        self.stage = [(c, cells[(c.region, c.index)]) for c in plan.chunks
                      if self.d in c.devices and (self.enc is None or c.region != first)]
        self.body = {id(cell): bodies[(c.region, c.index)] for c, cell in self.stage}
        self.trainable = {c.region: plan.trainable.get(c.region, True) for c in plan.chunks}
        self.params = [p for c, cell in self.stage if self.trainable[c.region] for p in cell.get_parameters()]
        self.total = self.M * max(1, plan.data_parallel)

    def side(self, m):
        g = self.comm.dp_index * self.M + m
        if g not in self.mb:
            mb = self.source.micro_batch(self.step_no, g)
            self.mb[g] = (mb, self.model.tensors(mb, 1.0 / self.total))
        return self.mb[g]

    def recv_shape(self, chunk, m):
        """Boundary spec of the chunk feeding ``chunk`` (the previous one in data flow)."""
        i = self.plan.chunks.index(chunk)
        prev = self.plan.chunks[i - 1]
        return self.model.boundary(prev.region, prev.stop, self.side(m)[0])

    def forward(self, m):
        from mindspore import ops
        from hyperparallel.runtime.compat import leaf
        mb, mt = self.side(m)
        first = self.stage[0][0]
        if self.enc is not None and first.index == 0 and self.d == 0:
            x = self.enc_out.pop(m)
        elif self.plan.chunks.index(first) == 0:
            x = self.model.model_input(mt)
        else:
            x = self.comm.recv(self.recv_shape(first, m).shape, self.d - 1)
        saved = []
        for c, cell in self.stage:
            i = self.plan.chunks.index(c)
            needs_grad = i > 0 and self.trainable[self.plan.chunks[i - 1].region]
            xl = leaf(x, requires_grad=needs_grad)
            if self.trainable[c.region]:
                out = self.tape.forward(self.body[id(cell)], xl, mt)
                saved.append((xl, out, cell, needs_grad))
            else:
                out = self.tape.no_grad(self.body[id(cell)], xl, mt)
            x = ops.stop_gradient(out)
        if self.d == self.P - 1:
            self.loss += float(out.asnumpy())
        else:
            self.comm.send(x, self.d + 1)
        self.saved[m] = (saved, out)

    def backward(self, m):
        from mindspore import ops
        from hyperparallel.runtime.compat import acc
        saved, out = self.saved.pop(m)
        if self.d == self.P - 1:
            sens = ops.ones_like(out)
        else:
            sens = self.comm.recv(tuple(out.shape), self.d + 1)
        for xl, o, cell, needs_grad in reversed(saved):
            params = list(cell.get_parameters())
            g = self.tape.grad([o], [sens], ([xl] if needs_grad else []) + params, keep_graph=False)
            if needs_grad:
                sens, g = g[0], g[1:]
            for p, gp in zip(params, g):
                self.grads[p.name] = acc(self.grads.get(p.name), gp)
        if self.d > 0 and saved and saved[0][3]:
            self.comm.send(sens, self.d - 1)

    def run_step(self, step):
        self.step_no, self.mb, self.saved, self.grads, self.loss = step, {}, {}, {}, 0.0
        if self.enc is not None:   # transpose: this rank's encoder forwards first, in its warmup bubble
            c, cell = self.enc
            self.enc_out = {}
            for m in range(self.d, self.M, self.P):
                mt = self.side(m)[1]
                from mindspore import ops
                out = ops.stop_gradient(self.tape.no_grad(cell, self.model.model_input(mt), mt))
                if self.d == 0:
                    self.enc_out[m] = out
                else:
                    self.comm.send(out, 0)
            if self.d == 0:   # gather the others' outputs to the first LLM stage, in the order sent
                for m in range(self.M):
                    if m % self.P:
                        self.enc_out[m] = self.comm.recv(self.recv_shape(self.stage[0][0], m).shape, m % self.P)
        warm = min(self.P - 1 - self.d, self.M)
        for m in range(warm):
            self.forward(m)
        for m in range(self.M - warm):
            self.forward(m + warm)
            self.backward(m)
        for m in range(self.M - warm, self.M):
            self.backward(m)
        return self.loss

    def step_grads(self):
        from mindspore import ops
        return {p.name: self.grads.get(p.name, None) if self.grads.get(p.name) is not None else ops.zeros_like(p)
                for p in self.params}


def schedule_of(plan) -> str:
    return "transpose" if any(len(c.devices) > 1 for c in plan.chunks) else "1f1b"


def timed_step(loop, opt, comm, step: int) -> dict:
    """One optimizer step of the bare loop, timed as the rank runtime times its own (program,
    optimizer, loss all-reduce)."""
    from hyperparallel.bench.ranks.measure import cpu_ticks, foreign_cpu_s
    c0 = cpu_ticks()
    t0 = time.perf_counter()
    part = loop.run_step(step)
    opt.step(loop.step_grads())
    loss = comm.all_reduce_scalar(part)
    t1 = time.perf_counter()
    compiles = sum(len(b.take_new()) for b in loop.bodies.values())
    return {"step": step, "step_s": t1 - t0, "loss": loss, "foreign_cpu_s": foreign_cpu_s(c0, cpu_ticks()),
            "compiles": compiles}


def runtime_step(rt, step: int) -> dict:
    from hyperparallel.bench.ranks.measure import cpu_ticks, foreign_cpu_s
    c0 = cpu_ticks()
    res = rt.step(step)
    return {"step": step, "step_s": res.step_s, "loss": res.loss, "foreign_cpu_s": foreign_cpu_s(c0, cpu_ticks()),
            "compiles": res.compiles}


def main(argv=None) -> int:
    from hyperparallel.runtime.comm import Comm
    from hyperparallel.runtime.job import case_runtime, end_job, start_job
    from hyperparallel.runtime.optim import Optimizer

    job = start_job(sys.argv[1:] if argv is None else argv)
    comm = Comm(1)
    # mode "runtime" or "bare": one loop; "both": each with its own Cells and optimizer, alternating
    # step by step in this one process (the order given by job["first"])
    modes = ["runtime", "bare"] if job["mode"] == "both" else [job["mode"]]
    if job.get("first") == "bare":
        modes.reverse()
    loops = {}
    for mode in modes:
        rc, rt = case_runtime(job, comm)
        if mode == "bare":
            loop = BareLoop(rt.plan, rc, comm, rt.source, rt.chunks, rt.bodies)
            loops[mode] = lambda step, loop=loop, opt=Optimizer(loop.params, rc.train): timed_step(loop, opt, comm, step)
        else:
            loops[mode] = lambda step, rt=rt: runtime_step(rt, step)
    steps = {m: [] for m in modes}
    for step in range(int(job["steps"])):
        for mode in modes:
            steps[mode].append(loops[mode](step))
            if comm.rank == 0:
                print(f"[{mode} {job['schedule']}] step {step + 1}/{job['steps']} loss {steps[mode][-1]['loss']:.6f} "
                      f"step_time {steps[mode][-1]['step_s']:.3f}s", flush=True)
    for mode in modes:
        out = os.path.join(job["out_dir"], mode) if job["mode"] == "both" else job["out_dir"]
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"rank_{comm.rank}.json"), "w") as f:
            json.dump({"rank": comm.rank, "steps": steps[mode]}, f)
    return end_job(comm)


if __name__ == "__main__":
    sys.exit(main())
