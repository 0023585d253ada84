"""Lower bounds of a candidate's step time and peak memory, from its cut and placement alone (no
derivation): the search derives a candidate only when its bound can still beat what it has found.

Both are bounds on what :func:`hyperparallel.mpipe.cost.simulate` reports for the derived plan, built
from the same per-task durations (:func:`~hyperparallel.mpipe.profile.task_ms` plus the runtime's time
per action, times ``device_scale``), the same chunk placement (:func:`~hyperparallel.mpipe.orders.device_of`)
and the same static memory rule. They are never reported as predictions.

Time, one step (every schedule without next-step spill), for each device d:

* ``busy_d``: the compute it must do (its LLM chunks' tasks for every micro-batch, a placed encoder's
  tasks, a transposed encoder's tasks where the owner policy fixes them (round_robin, min); balanced
  owners' encoder work only counts in the mean over devices);
* ``head_d + llm_d (+ tail_d)``: its LLM tasks cannot start before the first micro-batch has been
  through the encoder and the chunks before its first one (``head_d``); with a fused backward (BW), its
  last task is a BW whose micro-batch still needs the BW of every chunk before, on other devices
  (``tail_d``).

The bound is the largest of these over devices and the mean busy time, plus the step overhead. With
next-step spill the reported step is the steady state, the difference of two step ends, which is at
least the busy time of the least-loaded device (its next step's compute starts after the step's last
event reaches it), so that is the bound there.

A second, tighter time bound (:func:`body_bound`) runs the project's own derivation and cost model on
the LLM alone (the candidate's order, V, M and layer split; no encoder, free communication): the
executor is monotone (every action starts at the max of its device's previous end and its inputs'
arrival, in a fixed per-lane order), the candidate's programs hold the same LLM actions in the same
order (body invariance) plus encoder work, messages and collectives, so its step cannot be shorter.
It costs one derivation shared by every encoder option of a (order, V, M, split), so the search
computes it only for a candidate the cheap bound lets through (not for next-step spill, whose step
is a difference of two step ends).

Memory, device d: the parameters, grads and optimizer state it holds (exactly the cost model's static
memory) plus the largest one-micro-batch activation of a trained LLM chunk it holds.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Tuple

from ..mpipe import orders
from ..mpipe.cost import simulate
from ..mpipe.derive import derive
from ..mpipe.owners import owner_map
from ..mpipe.profile import LinkProfile, ModelProfile, task_ms
from ..mpipe.schedule import Pipe, Schedule
from .space import Candidate, Space


def _needs_bwd(profile: ModelProfile) -> List[bool]:
    out, seen = [], False
    for r in profile.regions:
        seen = seen or r.trainable
        out.append(seen)
    return out


def time_bound(space: Space, c: Candidate) -> float:
    prof = space.rank_profile(c)   # a recompute's R only adds time: the bound holds without it
    P, M, n = space.P, c.M, space.P * c.V
    scale = [prof.device_scale[d] if prof.device_scale else 1.0 for d in range(P)]
    ovh = prof.action_overhead_ms
    needs = _needs_bwd(prof)
    body = prof.regions[-1]
    split = orders.ORDERS[c.order].split
    if not needs[-1]:
        bkinds: Tuple[str, ...] = ()
    elif body.trainable:
        bkinds = ("B", "W") if split else ("BW",)
    else:
        bkinds = ("B",)
    dev = [orders.device_of(c.order, k, P) for k in range(n)]
    fwd = [task_ms(body, "F", c.layers[k], k == n - 1) + ovh for k in range(n)]
    bwd = [sum(task_ms(body, kind, c.layers[k], k == n - 1) + ovh for kind in bkinds) for k in range(n)]
    llm = [0.0] * P
    for k in range(n):
        llm[dev[k]] += M * (fwd[k] + bwd[k]) * scale[dev[k]]
    busy = list(llm)
    free = 0.0          # encoder work whose device the bound does not fix (balanced owners)
    enc_head = 0.0      # the first micro-batch's encoder forwards, before LLM chunk 0 can start
    for i, r in enumerate(prof.regions[:-1]):
        f = task_ms(r, "F", r.layers, True) + ovh
        b = (task_ms(r, "BW" if r.trainable else "B", r.layers, True) + ovh) if needs[i] else 0.0
        rec = (task_ms(r, "R", r.layers, True) + ovh) if needs[i] else 0.0
        enc = c.encoder
        if enc.skeleton == "place":
            busy[0] += M * (f + b) * scale[0]
            enc_head += f * scale[0]
            continue
        if enc.spill != "next_step":
            enc_head += f * min(scale)
        central = enc.backward == "central" and needs[i]
        if central:
            busy[dev[0]] += M * (rec + b) * scale[dev[0]]
        own = f if central else f + b
        if enc.owners == "balanced" and P > 1:
            free += M * own * min(scale)
            continue
        for d in owner_map(enc.owners, P, M):
            busy[d] += own * scale[d]
    if c.spill:
        return min(busy) + prof.step_overhead_ms
    lb = (sum(busy) + free) / P
    for d in range(P):
        first = min(k for k in range(n) if dev[k] == d)
        head = enc_head + sum(fwd[k] * scale[dev[k]] for k in range(first))
        tail = sum(bwd[k] * scale[dev[k]] for k in range(first)) if bkinds and not split else 0.0
        lb = max(lb, busy[d], head + llm[d] + tail)
    return lb + prof.step_overhead_ms


def memory_bound(space: Space, c: Candidate) -> List[float]:
    """Per device, a lower bound of its peak memory (MB). A recomputed chunk still holds its whole
    activation from its R to its backward, so the one-chunk activation term holds under recompute; ZeRO
    counts the optimizer state (and at level 2 the grads) 1/D, as the cost model does."""
    prof = space.rank_profile(c)
    P, n = space.P, space.P * c.V
    D = space.D
    zero = space.recipe.zero
    gshare, oshare = (1.0 / D if zero == 2 else 1.0), (1.0 / D if zero else 1.0)
    needs = _needs_bwd(prof)
    body = prof.regions[-1]
    opt = prof.optimizer_factor
    out = [0.0] * P
    act = [0.0] * P
    for k in range(n):
        d = orders.device_of(c.order, k, P)
        p = body.param_mb * c.layers[k]
        out[d] += p * (1 + (gshare + opt * oshare if body.trainable else 0))
        if needs[-1]:
            act[d] = max(act[d], body.activation_mb * c.layers[k])
    for i, r in enumerate(prof.regions[:-1]):
        p = r.param_mb * r.layers
        if c.encoder.skeleton == "place":
            out[0] += p * (1 + (gshare + opt * oshare if r.trainable else 0))
            continue
        central = c.encoder.backward == "central"
        for d in range(P):
            holds = r.trainable and not (central and d != 0)
            out[d] += p * (1 + (gshare + opt * oshare if holds else 0))
    return [s + a for s, a in zip(out, act)]


def body_bound(space: Space, c: Candidate, cache: Dict[tuple, float]) -> float:
    """The step of the LLM alone with ``c``'s order, V, M and split and free communication (see the
    module docstring); cached per (order, V, M, split) in ``cache``."""
    key = (c.order, c.V, c.M, c.layers, c.T)
    if key not in cache:
        prof = space.rank_profile(c)
        body = replace(prof, regions=(prof.regions[-1],), link=LinkProfile(0.0, 0.0))
        sched = Schedule(((space.body.name, Pipe(order=c.order, layers=c.layers)),))
        plan = derive(body, sched, space.P, c.M, c.V, space.D)
        cache[key] = simulate(plan, body).step_ms
    return cache[key]
