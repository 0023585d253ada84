"""Executes one rank's derived program, action by action, on real MindSpore Cells.

No schedule logic: the interpreter dispatches on ``action.kind`` and keeps
per-step stores keyed by ``(region, chunk, micro)``:

* ``F``: forward of the chunk (tape recording when this device will run its
  backward from this forward); input = the model input (first chunk), or the
  previous chunk's output, across regions; every chunk also gets the
  micro-batch's side inputs (the adapter's ``tensors``).
* ``R``: recompute a forward with the tape (central backward of a replica, or a recomputed chunk's:
  its ``F`` ran without the tape and kept only its input, which the ``R`` reads; the plan's
  ``Chunk.recompute`` says which, :mod:`hyperparallel.mpipe.recompute`).
* ``B``: input grad only (keeps the tape for ``W``); ``W``: weight grad;
  ``BW``: both at once. A chunk whose backward does not split on the tape (a compiled one,
  :mod:`.compiled`) computes its weight grads in ``B`` too and ``W`` adds them. The incoming gradient is d loss / d output of the chunk
  (1 for the model's last chunk, whose output is the scaled micro-batch loss).
* ``SEND``/``RECV``: activations or output-gradients; the receiver allocates
  with the adapter's ``boundary`` spec, the sender checks its tensor against
  the same spec (a wrong adapter fails on the first step, naming chunk and
  micro-batch, instead of corrupting the FIFO channel).
* ``ALLREDUCE wgrad``: sum a region's weight grads over replicas; ``ALLREDUCE tied``: sum the grads of
  the tied weights whose copies the group's devices hold (the adapter's ``tied_weights()`` names them);
  ``ALLREDUCE dp``: sum every gradient of this rank over its data-parallel group;
  ``BROADCAST weights``: copy a region's parameters from the root device;
  ``ALLGATHER weights``: a sharded optimizer's region (:mod:`.sharded`; over ``dp``: ZeRO, every region):
  nothing here; the rank's optimizer step updates this rank's share and gathers every share right after
  the program. ``REDUCESCATTER wgrad dp`` (ZeRO-2): the gradients of the action's region (the plan puts it
  right after the region's last weight-gradient task on this device), or without a region every gradient
  not scattered yet, summed over the data-parallel group, of which only this rank's share is kept
  (:attr:`Interpreter.scatter`, the rank's sharded optimizer); those whole gradients are dropped there.
  :attr:`Interpreter.peak_grad_bytes`: the step's peak bytes of the gradients held between actions
  (whole gradients and shares).

Host work never sits between a receive and its consumer or between a backward and its
send: before every blocking RECV the micro-batches (and model inputs) that the actions up to the
next RECV will read are built (:func:`prefetch_points`, read off the program), and weight-grad
adds wait until the SENDs that follow a backward have gone out.

Which forwards record a tape, and which inputs need a gradient, is read off the
plan (the backward actions it contains), not decided here. The model is reached
only through its adapter (:mod:`hyperparallel.models.base`), the data through the
data-source contract (:mod:`hyperparallel.data.source`): no region name, model class
or shape formula lives here. Timing and fault injection come in as explicit hooks
(:mod:`.hooks`).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from mindspore import Parameter, Tensor, ops

from hyperparallel.data import DataSource
from hyperparallel.data.loss_norm import loss_scales
from hyperparallel.models import ModelAdapter
from hyperparallel.models.lora import trained
from hyperparallel.mpipe import ir
from .compat import Tape, acc, leaf, write_param
from .compiled import build_bodies
from .hooks import Hooks
from .memory import HeldForwards, nbytes

Key = Tuple[str, int, int]
_KEPT = "kept weight grads"   # marks a B whose weight grads were computed with its input grad


class Interpreter:
    def __init__(self, plan: ir.Plan, comm, model: ModelAdapter, source: DataSource,
                 chunks: Dict[Tuple[str, int], object], hooks: Optional[Hooks] = None,
                 bodies: Optional[Dict[Tuple[str, int], object]] = None, loss_normalization: str = "tokens"):
        """``model``: the adapter; ``source``: the data source (pixels loaded lazily, so a boundary
        spec never needs them); ``chunks``: this rank's chunk Cells by (region, chunk index), built
        by the adapter; ``hooks``: timing / fault injection (:mod:`.hooks`; default none);
        ``bodies``: each chunk's forward as it runs, compiled or eager (:mod:`.compiled`; default eager);
        ``loss_normalization``: how micro-batch losses make the step loss (:mod:`hyperparallel.data.loss_norm`)."""
        self.plan, self.comm, self.model, self.source, self.chunks = plan, comm, model, source, chunks
        self.bodies = bodies if bodies is not None else build_bodies(chunks, "eager")
        # each chunk's trained parameters, listed once (a backward names them; Cell.get_parameters walks the Cell
        # tree); a base weight LoRA froze (model.lora) has no weight grad
        self.params_of = {k: trained(cell.get_parameters()) for k, cell in chunks.items()}
        self.device = comm.device
        self.program: List[ir.Action] = plan.programs.get(self.device, [])
        self.ahead_acts: Dict[Key, Tensor] = {}  # outputs of next-step (step=1) work, kept for the next step
        self.regions = plan.regions()
        self.num_chunks = {r: 1 + max(c.index for c in plan.chunks if c.region == r) for r in self.regions}
        self.chunk_stop = {(c.region, c.index): c.stop for c in plan.chunks}
        self.loss_chunk = (self.regions[-1], self.num_chunks[self.regions[-1]] - 1)  # returns the loss
        self.loss_seed = 1.0   # the loss chunk's backward seed: the loss scale of the step (set by the rank's step)
        self.total_micro = plan.num_micro * max(1, plan.data_parallel)
        self.loss_normalization = loss_normalization
        self._scales: Dict[int, List[float]] = {}   # loss scale of every global micro-batch, by step
        # Read off the plan: tasks with a backward anywhere (their inputs need grads),
        # and on this device: tasks backwarded here, tasks recomputed here.
        self.backwarded_anywhere = {(a.region, a.chunk, a.micro) for p in plan.programs.values()
                                    for a in p if a.kind in (ir.B, ir.BW)}
        mine = [(a.kind, (a.region, a.chunk, a.micro)) for a in self.program]
        self.recomputed_here = {k for kind, k in mine if kind == ir.R}
        self.recompute_chunks = {(c.region, c.index) for c in plan.chunks if c.recompute}
        self.backward_here = {k for kind, k in mine if kind in (ir.B, ir.BW, ir.W)}
        self.weight_grad_here = {k for kind, k in mine if kind == ir.W}
        # Parameters this rank updates: chunks it backwards, or regions it all-reduces.
        reduced = {a.region for a in self.program if a.kind == ir.ALLREDUCE and a.tensor == ir.WGRAD}
        self.updated: List[Parameter] = []
        for (region, idx), cell in sorted(chunks.items()):
            if not plan.trainable.get(region, True):
                continue
            if region in reduced or any(k[0] == region and k[1] == idx for k in self.backward_here):
                self.updated += trained(cell.get_parameters())
        # a tied weight held by two chunks of this rank is one Parameter: listed (and stepped) once
        self.updated = list(one_per_name(self.updated, model.family).values())
        self.tied = tied_names(plan, model, self.device)   # {tied weight label: parameter name} held here
        # the read-ahead hint for the source: the micro-batches whose model input (pixels) this rank reads
        self.first_chunk = (self.regions[0], 0)
        source.will_read_pixels(sorted({comm.dp_index * plan.num_micro + a.micro for a in self.program
                                        if (a.region, a.chunk) == self.first_chunk and a.kind in (ir.F, ir.R)}))
        self.prefetch_at = prefetch_points(self.program, self.first_chunk)
        self.grads: Dict[str, Optional[Tensor]] = {}
        # ZeRO-2: {share name: this rank's slice of the reduced gradients}, made by ``scatter`` (set by the rank
        # runtime to its sharded optimizer's, :mod:`.sharded`) at the plan's REDUCESCATTER
        self.grad_shares: Dict[str, Tensor] = {}
        self.scatter = None
        self.peak_grad_bytes = 0
        self._mb: Dict[tuple, tuple] = {}
        self.held = HeldForwards(self.regions)   # forwards held for a later backward (:mod:`.memory`)
        # the callables the hooks may wrap (timing), asked for once
        hooks = hooks or Hooks()
        w = hooks.wrap
        self._forward, self._no_grad, self._grad = (w("compute", n, getattr(Tape, n))
                                                    for n in ("forward", "no_grad", "grad"))
        self._send, self._recv, self._all_reduce, self._broadcast = (
            w("comm", n, getattr(comm, n)) for n in ("send", "recv", "all_reduce", "broadcast"))
        self._tensors = w("data", "tensors", self._build_tensors)
        self._model_input = w("data", "model_input", model.model_input)
        self._accumulate = w("accumulate", "add_grads", self.add_grads)
        self._before_action = hooks.before_action if hooks.per_action else None

    # -- helpers ---------------------------------------------------------------
    def _build_tensors(self, step: int, g: int):
        mb = self.source.micro_batch(step, g)
        if step not in self._scales:
            self._scales = {k: v for k, v in self._scales.items() if k >= step - 1}
            self._scales[step] = loss_scales(self.source, step, self.total_micro, self.loss_normalization)
        return mb, self.model.tensors(mb, self._scales[step][g])

    def micro(self, m: int, ahead: int = 0):
        """Side-input tensors of micro-batch m of this step, or of the next one (``ahead=1``)."""
        g = self.comm.dp_index * self.plan.num_micro + m
        if (ahead, g) not in self._mb:
            self._mb[(ahead, g)] = self._tensors(self._step + ahead, g)
        return self._mb[(ahead, g)][1]

    def prepare(self, a: ir.Action) -> bool:
        """Build the data action ``a`` reads now (its micro-batch; for the model's first chunk the model
        input too, pixels included); True if its micro-batch was built by this call (an action clock
        times data apart from compute)."""
        if a.micro is None:
            return False
        n = len(self._mb)
        mt = self.micro(a.micro, a.step)
        if (a.region, a.chunk) == self.first_chunk:
            self._model_input(mt)
        return len(self._mb) > n

    def micro_batches(self):
        """The micro-batches (data-source objects) built for the current step, by (ahead, global index)."""
        return {k: mb for k, (mb, _t) in sorted(self._mb.items())}

    def boundary(self, key: Key, ahead: int = 0):
        """Shape/dtype of the output of chunk ``key`` (the adapter's answer for this micro-batch)."""
        g = self.comm.dp_index * self.plan.num_micro + key[2]
        self.micro(key[2], ahead)
        return self.model.boundary(key[0], self.chunk_stop[key[:2]], self._mb[(ahead, g)][0])

    def prev_key(self, key: Key) -> Optional[Key]:
        prev = ir.prev_chunk(self.regions, self.num_chunks, key[0], key[1])
        return None if prev is None else prev + (key[2],)

    def chunk_input(self, key: Key, recompute: bool = False, ahead: int = 0) -> Tensor:
        prev = self.prev_key(key)
        if prev is None:
            return self._model_input(self.micro(key[2], ahead))
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

    def defer_grads(self, params, grads) -> None:
        """Accumulate after the sends that follow (see :meth:`run_step`): the adds are host-issued
        MindSpore work that would otherwise sit between a backward and the send of its input grad."""
        self.pending_acc.append((params, grads))

    def flush_grads(self) -> None:
        if not self.pending_acc:
            return
        for params, grads in self.pending_acc:
            self._accumulate(params, grads)
        self.pending_acc = []
        self.note_grads()

    def note_grads(self) -> None:
        """The peak of the gradient bytes held now: whole gradients and ZeRO-2 shares (:mod:`.memory`)."""
        held = sum(nbytes(g) for g in self.grads.values() if g is not None) + nbytes(self.grad_shares)
        if held > self.peak_grad_bytes:
            self.peak_grad_bytes = held

    # -- one optimizer step ----------------------------------------------------------
    def run_step(self, step: int) -> float:
        """Run the program once; returns this rank's part of the step loss."""
        self._step, self._mb = step, {}
        self.acts: Dict[Key, Tensor] = {}        # outputs waiting for a local consumer or a SEND
        self.acts_kept: Dict[Key, Tensor] = {}
        self.recomputed: Dict[Key, Tensor] = {}  # R outputs feeding the next R of the region
        self.kept: Dict[Key, Tensor] = {}        # inputs of recomputed chunks' forwards, for their R
        self.inputs: Dict[Key, Tensor] = {}
        self.outputs: Dict[Key, Tensor] = {}
        self.out_grads: Dict[Key, Tensor] = {}
        self.pending_w: Dict[Key, Tuple[Tensor, Tensor]] = {}
        self.grads = {p.name: None for p in self.updated}
        self.grad_shares = {}
        self.peak_grad_bytes = 0
        self.loss = 0.0
        self.pending_acc: List[tuple] = []
        self.acts.update(self.ahead_acts)  # next-step work done last step (or by the prologue)
        self.ahead_acts = {}
        self.held.new_step()
        before = self._before_action
        for i, a in enumerate(self.program):
            if before is not None:
                before(self, step, i, a)
            if self.pending_acc and a.kind != ir.SEND:
                self.flush_grads()
            if i in self.prefetch_at:
                self.prefetch(self.prefetch_at[i])
            getattr(self, "do_" + a.kind)(a)
        self.flush_grads()
        return self.loss

    def prefetch(self, needs) -> None:
        """Build the micro-batches (and load the model input) that the actions after a blocking
        receive will read, before the receive: host work the rank would otherwise do between the
        receive and its consumer (delaying it, and every peer waiting on it) is done while it waits."""
        for m, ahead, model_input in needs:
            mt = self.micro(m, ahead)
            if model_input:
                self._model_input(mt)

    def run_prologue(self, step: int) -> None:
        """Before the first step run here: the plan's next-step work for ``step`` (see ``Plan.prologue``)."""
        self._step, self._mb = step - 1, {}
        self.ahead_acts = {}
        for a in self.plan.prologue(self.device):
            getattr(self, "do_" + a.kind)(a)

    def forward(self, key: Key, record: bool, recompute: bool = False, ahead: int = 0) -> None:
        body = self.bodies[key[:2]]
        own = key[:2] in self.recompute_chunks   # a recomputed chunk: its R reads the input its F kept
        x = self.kept.pop(key) if recompute and own else self.chunk_input(key, recompute, ahead)
        mt = self.micro(key[2], ahead)
        out = self._forward(body, x, mt) if record else self._no_grad(body, x, mt)
        if record:
            self.inputs[key], self.outputs[key] = x, out
            self.held.hold(key, nbytes(x) + nbytes(out))
        elif own and key in self.recomputed_here and not ahead:
            self.kept[key] = x
            self.held.keep(key, nbytes(x))
        if ahead:
            self.ahead_acts[key] = ops.stop_gradient(out)
        elif recompute and own:
            pass   # the forward's output went on already (its loss counted once, by the F)
        elif key[:2] == self.loss_chunk:
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
        if key[:2] == self.loss_chunk:   # the seed: 1, or the loss scale (runner_wrapper.scale_sense)
            seed = ops.ones_like(out)
            return seed if self.loss_seed == 1.0 else seed * self.loss_seed
        raise RuntimeError(f"device {self.device}: no output gradient for {key} (missing RECV grad?)")

    def input_grad(self, key: Key, out: Tensor, sens: Tensor, keep: bool) -> None:
        x, prev = self.inputs[key], self.prev_key(key)
        if prev is not None and prev in self.backwarded_anywhere:
            (gx,) = self._grad([out], [sens], [x], keep_graph=keep)
            self.out_grads[prev] = gx

    def do_B(self, a: ir.Action) -> None:
        key = (a.region, a.chunk, a.micro)
        out = self.outputs[key]
        sens = self.sens(key, out)
        w_follows = key in self.weight_grad_here
        if w_follows and not self.bodies[key[:2]].splits:   # one backward call; W adds the kept grads
            self.pending_w[key] = (_KEPT, self.both_grads(key, out, sens))
            return
        self.input_grad(key, out, sens, keep=w_follows)
        self.pending_w[key] = (out, sens)
        if not w_follows:   # no W follows (a frozen region's input grad): B is its last
            self.held.release(key)

    def do_W(self, a: ir.Action) -> None:
        key = (a.region, a.chunk, a.micro)
        out, sens = self.pending_w.pop(key)
        params = self.params_of[key[:2]]
        if out is _KEPT or not params:   # no params: a chunk without LoRA adapters in a trained region
            grads = sens if out is _KEPT else ()
        else:
            grads = self._grad([out], [sens], params, keep_graph=False)
        self.defer_grads(params, grads)
        self.inputs.pop(key), self.outputs.pop(key)
        self.held.release(key)

    def both_grads(self, key: Key, out: Tensor, sens: Tensor) -> tuple:
        """Input grad (into ``out_grads``, when the previous chunk is backwarded) and the weight grads
        (returned) of ``key`` in one backward call."""
        x, prev = self.inputs[key], self.prev_key(key)
        params = self.params_of[key[:2]]
        need_x = prev is not None and prev in self.backwarded_anywhere
        if not need_x and not params:
            return ()
        g = self._grad([out], [sens], ([x] if need_x else []) + params, keep_graph=False)
        if need_x:
            self.out_grads[prev], g = g[0], g[1:]
        return tuple(g)

    def do_BW(self, a: ir.Action) -> None:
        key = (a.region, a.chunk, a.micro)
        out = self.outputs[key]
        g = self.both_grads(key, out, self.sens(key, out))
        self.inputs.pop(key), self.outputs.pop(key)
        self.defer_grads(self.params_of[key[:2]], g)
        self.held.release(key)

    def do_SEND(self, a: ir.Action) -> None:
        key = (a.region, a.chunk, a.micro)
        if a.step:
            t = self.ahead_acts.pop(key)
        elif a.tensor == ir.ACT:
            t = self.acts.pop(key)
            self.acts_kept[key] = t  # a second SEND of the same output may follow
        else:
            t = self.out_grads.pop(key)
        spec = self.boundary(key, a.step)
        if tuple(t.shape) != tuple(spec.shape):
            raise RuntimeError(f"model adapter {self.model.family}: chunk {a.region}/{a.chunk} micro-batch "
                               f"{a.micro}: {a.tensor} has shape {tuple(t.shape)} but the adapter's boundary "
                               f"spec says {tuple(spec.shape)} (device {self.device}, before SEND to {a.peer})")
        self._send(t, a.peer)

    def do_RECV(self, a: ir.Action) -> None:
        key = (a.region, a.chunk, a.micro)
        spec = self.boundary(key, a.step)
        t = self._recv(spec.shape, a.peer, spec.dtype)
        if a.step:
            self.ahead_acts[key] = t
        else:
            (self.acts if a.tensor == ir.ACT else self.out_grads)[key] = t

    def region_params(self, region: str) -> List[Parameter]:
        return [p for (r, _), cell in sorted(self.chunks.items()) if r == region
                for p in trained(cell.get_parameters())]

    def do_ALLREDUCE(self, a: ir.Action) -> None:
        if a.group == ir.DP_GROUP:
            params = self.updated
        elif a.tensor == ir.TIED:
            names = {self.tied[t.name] for t in self.plan.tied if t.region == a.region and t.devices == a.group}
            params = [p for p in self.updated if p.name in names]
        else:
            params = [p for p in self.region_params(a.region) if p.name in self.grads]
        tensors = [self.grads[p.name] if self.grads[p.name] is not None else ops.zeros_like(p)
                   for p in params]
        for p, g in zip(params, self._all_reduce(tensors, a.group)):
            self.grads[p.name] = g

    def do_BROADCAST(self, a: ir.Action) -> None:
        params = self.region_params(a.region)
        new = self._broadcast([ops.stop_gradient(p) * 1 for p in params], a.root, a.group)
        if self.device != a.root:
            for p, v in zip(params, new):
                write_param(p, v)   # in place: a compiled chunk keeps reading the parameter's buffer

    def do_ALLGATHER(self, a: ir.Action) -> None:
        pass   # the end-of-step gather of a sharded region: done by the rank's optimizer step (.sharded)

    def do_REDUCESCATTER(self, a: ir.Action) -> None:
        if self.scatter is None:
            raise RuntimeError(f"{a.label()}: the plan reduce-scatters the gradients (ZeRO-2), but this rank's "
                               "optimizer is not sharded over its data-parallel group")
        names = None if a.region is None else {p.name for p in self.region_params(a.region)}
        grads = {p.name: (self.grads[p.name] if self.grads[p.name] is not None else ops.zeros_like(p))
                 for p in self.updated if p.name in self.grads and (names is None or p.name in names)}
        self.grad_shares.update(self.scatter(grads))
        for n in grads:   # only the shares are kept (ZeRO-2's point)
            del self.grads[n]
        self.note_grads()

    def step_grads(self) -> Dict[str, Tensor]:
        """Gradients of the parameters this rank updates (zeros where none arrived); under ZeRO-2 this
        rank's shares of them instead (by share name)."""
        out = {p.name: (self.grads[p.name] if self.grads[p.name] is not None else ops.zeros_like(p))
               for p in self.updated if p.name in self.grads}
        out.update(self.grad_shares)
        return out


def one_per_name(params, family: str = "model") -> Dict[str, Parameter]:
    """{name: parameter} of ``params``; two different Parameters of one name (a tied weight whose chunks the
    adapter built apart) would be two optimizer states of one weight: refused, naming it."""
    out: Dict[str, Parameter] = {}
    for p in params:
        if p.name in out and out[p.name] is not p:
            raise RuntimeError(f"model adapter {family}: two Parameters named {p.name!r} on one rank; the chunks "
                               "sharing a tied weight must hold one Parameter (build them from one network)")
        out.setdefault(p.name, p)
    return out


def tied_names(plan: ir.Plan, model: ModelAdapter, device: int) -> Dict[str, str]:
    """{label: parameter name} of the plan's tied weights that ``device`` holds a copy of, by the adapter's
    ``tied_weights()``; a label the adapter does not tie is refused (its copies would train apart)."""
    names = model.tied_weights()
    out = {}
    for t in plan.tied_on(device):
        if t.name not in names:
            raise RuntimeError(f"model adapter {model.family}: the plan ties {t.name!r} but the model's "
                               f"tied_weights() gives {sorted(names) or 'none'}")
        out[t.name] = names[t.name]
    return out


def prefetch_points(program: List[ir.Action], first_chunk: Tuple[str, int]) -> Dict[int, List[tuple]]:
    """Where the interpreter prepares data ahead: for every RECV at index i, the micro-batches
    ``(micro, step offset, reads the model input)`` that the actions from i up to and including the
    next RECV will touch first, in first-use order (read off the program). The window ends before a
    SEND: data built ahead of a send would delay the send, and the peer waiting on it."""
    def needs(a: ir.Action) -> List[tuple]:
        if a.micro is None:
            return []
        reads_input = (a.region, a.chunk) == first_chunk and a.kind in (ir.F, ir.R)
        return [(a.micro, a.step, False)] + ([(a.micro, a.step, True)] if reads_input else [])

    out: Dict[int, List[tuple]] = {}
    done = set()   # (micro, step, model input) built by an earlier action or prefetch
    for i, head in enumerate(program):
        if head.kind == ir.RECV:
            ahead = []
            for j in range(i, len(program)):
                a = program[j]
                if j > i and a.kind == ir.SEND:
                    break
                for item in needs(a):
                    if item not in done:
                        done.add(item)
                        ahead.append(item)
                if j > i and a.kind == ir.RECV:
                    break
            # one entry per micro-batch: loading the model input builds the micro-batch too
            ahead = [x for x in ahead if x[2] or (x[0], x[1], True) not in ahead]
            if ahead:
                out[i] = ahead
        done.update(needs(head))
    return out
