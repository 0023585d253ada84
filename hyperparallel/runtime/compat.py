"""MindSpore-on-CPU workarounds and the tape autograd wrapper, in one place.

Every internal API or behaviour we rely on is named here, so that a MindSpore
upgrade breaks exactly this module and ``tests/integration/test_mindspore_compat.py`` says so.

Worked-around behaviours (MindSpore 2.9.0 / 2.10.0, CPU):

* Asynchronous dispatch makes per-op latency noisy on small CPUs and lets a
  receive return before data arrives: we call ``mindspore.runtime.launch_blocking()``
  right after ``set_device`` (:func:`setup_device`).
* ``mint.distributed.send/recv`` look up the caller's rank in the default group
  ``"hccl_world_group"``, which does not exist on CPU (MCCL's world group is
  ``"mccl_world_group"``): :func:`fix_default_comm_group` points the rank cache's
  default at ``GlobalComm.WORLD_COMM_GROUP``.
* In-place tensor methods (``add_``, ``mul_``) silently do nothing on CPU: the
  runtime never uses them; gradients are accumulated out of place (:func:`acc`)
  and parameters are written with :func:`write_param` (``ops.assign``).
* ``Parameter.set_data`` gives the parameter a new buffer, but a ``mindspore.jit`` graph compiled
  before keeps reading the old one (2.9.0, CPU: the graph's result stays the old weights', silently;
  eager sees the new ones). Every parameter the runtime writes after set-up (broadcast replicas, a
  sharded optimizer's gather, a checkpoint restore) goes through :func:`write_param`, in place.
  A MindSpore optimizer Cell holds the model parameters it updates, so ``load_param_into_net`` on it
  would ``set_data`` them too: :func:`load_optimizer_state` loads only its own state.
* ``mindspore.vjp`` only runs pending backwards newest-first, and
  ``GradOperation(sens_param=True)`` recomputes the forward. The runtime uses the
  tape autograd that PyNative itself uses (internal API):
  ``_pynative_executor.set_grad_flag(True)`` while running a stage forward, and
  ``mindspore._c_expression.run_backward(...)`` later, in any order, with the
  input grad (B) and weight grad (W) as separate calls (:class:`Tape`).
* A ``mindspore.jit`` graph run under the tape gives the eager results in one combined backward
  (input and weights as ``inputs``), but its backward does not split: after an input-grad call with
  ``keep_graph=True`` the later weight-grad call returns None for every parameter (2.9.0, CPU).
  :data:`JIT_SPLITS_BACKWARD` says so; a compiled chunk's ``B`` then computes its weight grads too
  and ``W`` adds them (:mod:`.compiled`). ``tests/unit/test_compiled.py`` fails when this changes.
* ``mint.distributed.barrier`` ends with ``mindspore.runtime.synchronize()``, which on CPU logs
  ``[ERROR] ... CPU device is not supported`` (``mindspore/runtime/device.py``, ``_is_supported``)
  and does nothing else: harmless, but it alarms every user at the end of every job. On CPU
  :func:`barrier` is a one-element blocking all-reduce instead (every rank must join it, so it is a
  barrier); on Ascend it is MindSpore's own.
* MCCL's point-to-point receive gives up after 30 s with ``Recv failed.`` when no sender comes
  (``collective_ops_impl.cc``, ``CollectiveWait``; the CPU collectives' op timeout, read from
  ``MS_NODE_TIMEOUT`` when it is set). A pipeline peer may well be busy longer than that on a
  loaded CPU host, compiling its chunks' graphs in the first step while the next stage waits for
  its activation: a correct job then dies. :func:`comm_timeouts` sets ``MS_NODE_TIMEOUT`` to
  :data:`CPU_COMM_TIMEOUT_S` (HCCL's default execution timeout, so CPU and Ascend wait alike)
  before ``init()`` unless the user set it; a rank that really stops is still found by the
  launcher's hang watchdog (``train.hang_timeout_s``) and a dead one by msrun.
* ``mint.distributed.reduce_scatter`` / ``reduce_scatter_tensor`` (and the ``ReduceScatter`` primitive) do
  not work on MCCL (CPU; 2.9.0 / 2.10.0). ZeRO-2 reduces the gradients with :func:`reduce_scatter`: on CPU an
  all-reduce of the whole flat buffer, of which the rank keeps its own slice (the same sums, more traffic);
  on Ascend MindSpore's own ``reduce_scatter_tensor``.
* msrun starts its scheduler on every node whose addresses include ``--master_addr``
  (``mindspore/parallel/cluster/process_entity/_api.py``: ``is_master = _is_local_ip(master_addr)``),
  whatever ``--node_rank`` says. Two nodes of one job on one machine (a test of the multi-node path,
  or several "nodes" sharing a big host) then both start one: the second fails to bind the port and
  its msrun ends the job as failed. :func:`msrun_node` (``python -m hyperparallel.runtime.compat
  MSRUN_FLAGS...``) runs msrun with the scheduler left to node 0; the launcher uses it only for a
  node rank above 0 whose ``--master_addr`` is local.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import mindspore as ms
from mindspore import ops

# Internal APIs (checked by tests/integration/test_mindspore_compat.py).
from mindspore._c_expression import run_backward as _run_backward
from mindspore.graph.api import _pynative_executor as _executor

#: Whether a jit graph's backward can run as a separate input grad and weight grad (see the docstring).
JIT_SPLITS_BACKWARD = False

_RUN_BACKWARD_PARAMS = ("tensors", "grad_tensors", "keep_graph", "create_graph", "inputs",
                        "allow_unreachable", "accumulate_grad")


def setup_device(target: str = "CPU") -> None:
    """Select the device and switch to blocking launch (see module docstring)."""
    ms.set_device(target)
    ms.runtime.launch_blocking()


#: MCCL's communication timeout the runtime asks for on CPU (seconds; HCCL_EXEC_TIMEOUT's default).
CPU_COMM_TIMEOUT_S = 1800


def comm_timeouts() -> str:
    """Before ``init()``: on CPU, MCCL's receive timeout raised from 30 s to :data:`CPU_COMM_TIMEOUT_S`
    through ``MS_NODE_TIMEOUT`` (see the module docstring) unless the environment sets it. Returns the
    value in force."""
    import os
    if ms.get_context("device_target") == "CPU":
        os.environ.setdefault("MS_NODE_TIMEOUT", str(CPU_COMM_TIMEOUT_S))
    return os.environ.get("MS_NODE_TIMEOUT", "")


def barrier(group=None) -> None:
    """Wait for every rank of ``group`` (default: the world), without MindSpore's CPU ``[ERROR]`` line."""
    import numpy as np
    import mindspore.mint.distributed as dist
    kw = {} if group is None else {"group": group}
    if ms.get_context("device_target") == "CPU":
        dist.all_reduce(ms.Tensor(np.zeros(1, np.float32)), **kw)
        return
    dist.barrier(**kw)


def reduce_scatter(flat: ms.Tensor, members: int, index: int, group: str) -> ms.Tensor:
    """Slice ``index`` (of ``members`` equal slices) of the sum of ``flat`` over ``group`` (a communication
    group name): MindSpore's ``reduce_scatter``, emulated on CPU (see the module docstring)."""
    import mindspore.mint.distributed as dist
    k = flat.shape[0] // members
    if ms.get_context("device_target") == "CPU":
        total = flat * 1   # all_reduce writes its input; the caller's buffer stays as it was
        dist.all_reduce(total, group=group)
        return total[index * k:(index + 1) * k].copy()
    out = ops.zeros((k,), flat.dtype)
    dist.reduce_scatter_tensor(out, flat, group=group)
    return out


def fix_default_comm_group() -> None:
    """Make mint.distributed P2P look up ranks in the backend's real world group."""
    from mindspore.communication import GlobalComm
    import mindspore.mint.distributed.distributed as dist
    dist.get_cache_group_rank.__defaults__ = (GlobalComm.WORLD_COMM_GROUP,)


def check_internal_api() -> None:
    """Raise RuntimeError naming the change if the tape autograd internals moved."""
    if not hasattr(_executor, "set_grad_flag"):
        raise RuntimeError("mindspore.graph.api._pynative_executor.set_grad_flag is gone")
    doc = (_run_backward.__doc__ or "").split("\n")[0]
    missing = [p for p in _RUN_BACKWARD_PARAMS if p not in doc]
    if missing:
        raise RuntimeError(f"mindspore._c_expression.run_backward signature changed "
                           f"(missing {missing}): {doc}")


def jit(fn):
    """``fn`` (a Cell's tensor-only method) compiled with ``mindspore.jit``: one static graph per distinct
    input shape. Not MindSpore's automatic dynamic shapes (``dynamic=1``, at most 3 compiles for any
    number of shapes): its dynamic-shape graph ran about 2x slower than a static one on 2.9.0, CPU
    (the bench's steps were bimodal, 170-250 ms with static graphs, 340-650 ms with the dynamic one;
    static per shape: ``bench_encoder_heavy`` 1f1b 2.67x, transpose 2.19x over eager)."""
    return ms.jit(fn)


def graphs_compiled() -> int:
    """Graphs MindSpore has compiled in this process (internal: ``mindspore.graph.api.ms_compile_cache``, the
    set of compiled phases that ``jit`` adds to on every compile), to count a chunk's compiles exactly."""
    from mindspore.graph import api
    return len(api.ms_compile_cache)


def taping() -> bool:
    """Whether the tape records the ops run now (internal: ``_pynative_executor.grad_flag``); MindSpore
    compiles a jit graph once for each."""
    return bool(_executor.grad_flag())


def write_param(p, value) -> None:
    """Write ``value`` into parameter ``p`` in place (``ops.assign``; never ``set_data``, see the docstring)."""
    ops.assign(p, ops.stop_gradient(value).astype(p.dtype).reshape(p.shape))


def load_optimizer_state(opt_cell, values: dict) -> None:
    """``values`` (name -> tensor) into a MindSpore optimizer Cell's own state (``load_param_into_net``,
    strict names). The Cell also holds the model parameters it updates, which ``load_param_into_net``
    would ``set_data`` (see the docstring): those are left out; the caller writes them in place."""
    model = {p.name for p in opt_cell.parameters}
    ms.load_param_into_net(opt_cell, {n: v for n, v in values.items() if n not in model}, strict_load=True)


def leaf(t: ms.Tensor, requires_grad: bool) -> ms.Tensor:
    """A fresh tape leaf holding t's values (cuts the graph at a chunk boundary)."""
    x = ops.stop_gradient(t)
    if requires_grad:
        x._requires_grad = True  # internal: mark as a differentiable input of the tape
    return x


def acc(total, g):
    """Out-of-place accumulation (in-place add_ is a silent no-op on CPU)."""
    return g if total is None else total + g


class Tape:
    """Record forwards now, run their backward later, in any order (PyNative tape)."""

    @staticmethod
    def forward(fn, *args):
        """Run ``fn(*args)`` with the grad tape recording."""
        _executor.set_grad_flag(True)
        return fn(*args)

    @staticmethod
    def no_grad(fn, *args):
        """Run ``fn(*args)`` without recording (frozen or forward-only work)."""
        _executor.set_grad_flag(False)
        try:
            return fn(*args)
        finally:
            _executor.set_grad_flag(True)

    @staticmethod
    def grad(outputs: Sequence[ms.Tensor], sens: Sequence[ms.Tensor],
             inputs: Sequence[ms.Tensor], keep_graph: bool) -> Tuple[ms.Tensor, ...]:
        """d(sum outputs*sens)/d inputs; ``keep_graph`` keeps the tape for a later W."""
        out = _run_backward(tuple(outputs), tuple(sens), keep_graph, False, tuple(inputs), True,
                            accumulate_grad=False)
        return tuple(out)


def run_op_by_op(cell, *args) -> bool:
    """Run ``cell.construct`` without its ``@jit`` graph: MindSpore's ``jit`` wraps the function with
    ``functools.wraps``, so ``__wrapped__`` is the Python body it compiles (what ``MS_JIT=0`` runs, for
    this Cell only). False (nothing run) when ``construct`` is not jit-wrapped."""
    body = getattr(type(cell).construct, "__wrapped__", None)
    if body is None:
        return False
    body(cell, *args)
    return True


def msrun_node(argv) -> int:
    """msrun for a node rank above 0 whose ``--master_addr`` is this machine: no second scheduler."""
    import sys
    from mindspore.parallel.cluster import run
    from mindspore.parallel.cluster.process_entity import _api
    _api._is_local_ip = lambda _ip: False
    sys.argv = ["msrun"] + list(argv)
    return run.main()


if __name__ == "__main__":
    import sys
    sys.exit(msrun_node(sys.argv[1:]))
