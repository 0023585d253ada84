"""Executes one rank's derived program, action by action, on real MindSpore Cells.

No schedule logic: the interpreter dispatches on ``action.kind`` and keeps
per-step stores keyed by ``(region, chunk, micro)``:

* ``F``: forward of the chunk (tape recording when this device will run its
  backward from this forward); input = data, previous chunk's output, or the
  previous region's last output (+ token ids from data for llm chunk 0).
* ``R``: recompute a forward with the tape (central backward of a replica).
* ``B``: input grad only (keeps the tape for ``W``); ``W``: weight grad;
  ``BW``: both at once. The incoming gradient is d loss / d output of the chunk
  (1 for the last llm chunk, whose output is the scaled micro-batch loss).
* ``SEND``/``RECV``: activations or output-gradients, shapes known from the
  regenerated micro-batch (number of images) and the model config.
* ``ALLREDUCE wgrad``: sum a region's weight grads over replicas;
  ``ALLREDUCE dp``: sum every gradient of this rank over its data-parallel group;
  ``BROADCAST weights``: copy a region's parameters from the root device.

Which forwards record a tape, and which inputs need a gradient, is read off the
plan (the backward actions it contains), not decided here.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from mindspore import Parameter, Tensor, ops

from hyperparallel.mpipe import ir
from .compat import Tape, acc, leaf
from .config import LLM, RunConfig
from .data import MicroTensors, make_micro_batch
from .model import ChunkCell

Key = Tuple[str, int, int]


class Interpreter:
    def __init__(self, plan: ir.Plan, comm, rc: RunConfig, chunks: Dict[Tuple[str, int], ChunkCell]):
        self.plan, self.comm, self.rc, self.chunks = plan, comm, rc, chunks
        self.device = comm.device
        self.program: List[ir.Action] = plan.programs.get(self.device, [])
        self.ahead_acts: Dict[Key, Tensor] = {}  # outputs of next-step (step=1) work, kept for the next step
        self.regions = plan.regions()
        self.num_chunks = {r: 1 + max(c.index for c in plan.chunks if c.region == r) for r in self.regions}
        self.total_micro = plan.num_micro * max(1, plan.data_parallel)
        # Read off the plan: tasks with a backward anywhere (their inputs need grads),
        # and on this device: tasks backwarded here, tasks recomputed here.
        self.backwarded_anywhere = {(a.region, a.chunk, a.micro) for p in plan.programs.values()
                                    for a in p if a.kind in (ir.B, ir.BW)}
        mine = [(a.kind, (a.region, a.chunk, a.micro)) for a in self.program]
        self.recomputed_here = {k for kind, k in mine if kind == ir.R}
        self.backward_here = {k for kind, k in mine if kind in (ir.B, ir.BW, ir.W)}
        # Parameters this rank updates: chunks it backwards, or regions it all-reduces.
        reduced = {a.region for a in self.program if a.kind == ir.ALLREDUCE and a.tensor == ir.WGRAD}
        self.updated: List[Parameter] = []
        for (region, idx), cell in sorted(chunks.items()):
            if not plan.trainable.get(region, True):
                continue
            if region in reduced or any(k[0] == region and k[1] == idx for k in self.backward_here):
                self.updated += list(cell.get_parameters())
        self.grads: Dict[str, Optional[Tensor]] = {}
        self.hook = None  # called as hook(step, action index, program length); fault injection
        self.tape = Tape  # autograd entry points; ``hyperparallel bench`` swaps in a timing wrapper

    # -- helpers ---------------------------------------------------------------
    def micro(self, m: int, ahead: int = 0) -> MicroTensors:
        """Micro-batch m of this step, or of the next one (``ahead=1``) for next-step work."""
        g = self.comm.dp_index * self.plan.num_micro + m
        if (ahead, g) not in self._mb:
            mb = make_micro_batch(self.rc.data, self.rc.train.seed, self._step + ahead, g)
            self._mb[(ahead, g)] = MicroTensors(mb, 1.0 / self.total_micro)
        return self._mb[(ahead, g)]

    def prev_key(self, key: Key) -> Optional[Key]:
        prev = ir.prev_chunk(self.regions, self.num_chunks, key[0], key[1])
        return None if prev is None else prev + (key[2],)

    def out_shape(self, key: Key, ahead: int = 0) -> Tuple[int, ...]:
        region, c, m = key
        cfg = self.rc.model
        if region == LLM:
            return (self.rc.data.micro_batch_size, cfg.seq_len, cfg.llm_dim)
        n = self.micro(m, ahead).batch.num_images
        if c == self.num_chunks[region] - 1:
            return (n, cfg.llm_dim)
        return (n, cfg.num_patches, cfg.vision_dim)

    def chunk_input(self, key: Key, recompute: bool = False, ahead: int = 0) -> Tensor:
        prev = self.prev_key(key)
        if prev is None:
            return self.micro(key[2], ahead).patches
        if ahead:
            src = self.ahead_acts.pop(prev)
        elif recompute and prev in self.recomputed:
            src = self.recomputed.pop(prev)
        elif prev in self.acts:
            src = self.acts.pop(prev)
        else:
            src = self.acts_kept[prev]
        return leaf(src, requires_grad=prev in self.backwarded_anywhere)

    def add_grads(self, params, grads) -> None:
        for p, g in zip(params, grads):
            self.grads[p.name] = acc(self.grads.get(p.name), g)

    # -- one optimizer step ----------------------------------------------------------
    def run_step(self, step: int) -> float:
        """Run the program once; returns this rank's part of the step loss."""
        self._step, self._mb = step, {}
        self.acts: Dict[Key, Tensor] = {}        # outputs waiting for a local consumer or a SEND
        self.acts_kept: Dict[Key, Tensor] = {}
        self.recomputed: Dict[Key, Tensor] = {}  # R outputs feeding the next R of the region
        self.inputs: Dict[Key, Tensor] = {}
        self.outputs: Dict[Key, Tensor] = {}
        self.out_grads: Dict[Key, Tensor] = {}
        self.pending_w: Dict[Key, Tuple[Tensor, Tensor]] = {}
        self.grads = {p.name: None for p in self.updated}
        self.loss = 0.0
        self.acts.update(self.ahead_acts)  # next-step work done last step (or by the prologue)
        self.ahead_acts = {}
        for i, a in enumerate(self.program):
            if self.hook is not None:
                self.hook(step, i, len(self.program))
            getattr(self, "do_" + a.kind)(a)
        return self.loss

    def run_prologue(self, step: int) -> None:
        """Before the first step run here: the plan's next-step work for ``step`` (see ``Plan.prologue``)."""
        self._step, self._mb = step - 1, {}
        self.ahead_acts = {}
        for a in self.plan.prologue(self.device):
            getattr(self, "do_" + a.kind)(a)

    def forward(self, key: Key, record: bool, recompute: bool = False, ahead: int = 0) -> None:
        cell = self.chunks[key[:2]]
        x = self.chunk_input(key, recompute, ahead)
        mt = self.micro(key[2], ahead)
        out = self.tape.forward(cell.forward, x, mt) if record else self.tape.no_grad(cell.forward, x, mt)
        if record:
            self.inputs[key], self.outputs[key] = x, out
        if ahead:
            self.ahead_acts[key] = ops.stop_gradient(out)
        elif cell.region == LLM and cell.last:
            self.loss += float(out.asnumpy())
        elif recompute:
            self.recomputed[key] = ops.stop_gradient(out)  # only a later R consumes it
        else:
            self.acts[key] = ops.stop_gradient(out)

    def do_F(self, a: ir.Action) -> None:
        key = (a.region, a.chunk, a.micro)
        if a.step:  # next-step work of a frozen region: no tape
            self.forward(key, record=False, ahead=a.step)
            return
        self.forward(key, record=key in self.backward_here and key not in self.recomputed_here)

    def do_R(self, a: ir.Action) -> None:
        self.forward((a.region, a.chunk, a.micro), record=True, recompute=True)

    def sens(self, key: Key, out: Tensor) -> Tensor:
        if key in self.out_grads:
            return self.out_grads.pop(key)
        if key[0] == LLM and self.chunks[key[:2]].last:
            return ops.ones_like(out)
        raise RuntimeError(f"device {self.device}: no output gradient for {key} (missing RECV grad?)")

    def input_grad(self, key: Key, out: Tensor, sens: Tensor, keep: bool) -> None:
        x, prev = self.inputs[key], self.prev_key(key)
        if prev is not None and prev in self.backwarded_anywhere:
            (gx,) = self.tape.grad([out], [sens], [x], keep_graph=keep)
            self.out_grads[prev] = gx

    def do_B(self, a: ir.Action) -> None:
        key = (a.region, a.chunk, a.micro)
        out = self.outputs[key]
        sens = self.sens(key, out)
        self.input_grad(key, out, sens, keep=True)
        self.pending_w[key] = (out, sens)

    def do_W(self, a: ir.Action) -> None:
        key = (a.region, a.chunk, a.micro)
        out, sens = self.pending_w.pop(key)
        params = list(self.chunks[key[:2]].get_parameters())
        self.add_grads(params, self.tape.grad([out], [sens], params, keep_graph=False))
        self.inputs.pop(key), self.outputs.pop(key)

    def do_BW(self, a: ir.Action) -> None:
        key = (a.region, a.chunk, a.micro)
        out = self.outputs.pop(key)
        sens = self.sens(key, out)
        x, prev = self.inputs.pop(key), self.prev_key(key)
        params = list(self.chunks[key[:2]].get_parameters())
        need_x = prev is not None and prev in self.backwarded_anywhere
        g = self.tape.grad([out], [sens], ([x] if need_x else []) + params, keep_graph=False)
        if need_x:
            self.out_grads[prev], g = g[0], g[1:]
        self.add_grads(params, g)

    def do_SEND(self, a: ir.Action) -> None:
        key = (a.region, a.chunk, a.micro)
        if a.step:
            t = self.ahead_acts.pop(key)
        elif a.tensor == ir.ACT:
            t = self.acts.pop(key)
            self.acts_kept[key] = t  # a second SEND of the same output may follow
        else:
            t = self.out_grads.pop(key)
        self.comm.send(t, a.peer)

    def do_RECV(self, a: ir.Action) -> None:
        key = (a.region, a.chunk, a.micro)
        t = self.comm.recv(self.out_shape(key, a.step), a.peer)
        if a.step:
            self.ahead_acts[key] = t
        else:
            (self.acts if a.tensor == ir.ACT else self.out_grads)[key] = t

    def region_params(self, region: str) -> List[Parameter]:
        return [p for (r, _), cell in sorted(self.chunks.items()) if r == region
                for p in cell.get_parameters()]

    def do_ALLREDUCE(self, a: ir.Action) -> None:
        if a.group == ir.DP_GROUP:
            params = self.updated
        else:
            params = [p for p in self.region_params(a.region) if p.name in self.grads]
        tensors = [self.grads[p.name] if self.grads[p.name] is not None else ops.zeros_like(p)
                   for p in params]
        for p, g in zip(params, self.comm.all_reduce(tensors, a.group)):
            self.grads[p.name] = g

    def do_BROADCAST(self, a: ir.Action) -> None:
        params = self.region_params(a.region)
        new = self.comm.broadcast([ops.stop_gradient(p) * 1 for p in params], a.root, a.group)
        if self.device != a.root:
            for p, v in zip(params, new):
                p.set_data(v.copy())

    def step_grads(self) -> Dict[str, Tensor]:
        """Gradients of the parameters this rank updates (zeros where none arrived)."""
        return {p.name: (self.grads[p.name] if self.grads[p.name] is not None else ops.zeros_like(p))
                for p in self.updated}
