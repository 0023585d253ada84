"""Timelines of simulated plans: Chrome/Perfetto trace JSON and a Gantt PNG.

Both read only the timed programs (``CostReport.execution.timeline``) that the
cost model produced by executing ``plan.programs``; nothing here knows any
schedule. ``results`` is a list of ``(plan, CostReport)``, one per schedule.
matplotlib is imported lazily inside :func:`write_png` (Agg backend).
"""
from __future__ import annotations

import json
from typing import Dict, List, Sequence, Tuple

from .ir import B, BACKWARD_KINDS, BW, F, R, W, Action, Plan

COMPUTE_TID, COMM_TID = 0, 1
PID_STRIDE = 1000  # pid = schedule index * PID_STRIDE + device: one process group per schedule


def _schedule_name(plan: Plan, k: int) -> str:
    return plan.meta.get("schedule_name") or f"schedule {k}"


def _args(a: Action, step: int) -> dict:
    out = {"kind": a.kind, "iteration": step}
    for key in ("region", "chunk", "micro", "tensor", "peer", "root"):
        v = getattr(a, key)
        if v is not None:
            out[key] = v
    if a.group is not None:
        out["group"] = a.group if isinstance(a.group, str) else list(a.group)
    if a.step:
        out["for_next_step"] = True
    return out


def trace_events(results: Sequence[Tuple[Plan, object]]) -> List[dict]:
    """Complete events (``ph: X``, microseconds), one process per (schedule, device)."""
    events: List[dict] = []
    for k, (plan, rep) in enumerate(results):
        name = _schedule_name(plan, k)
        for d in range(plan.num_devices):
            pid = k * PID_STRIDE + d
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                           "args": {"name": f"[{k}] {name} / device {d}"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                           "args": {"sort_index": pid}})
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": COMPUTE_TID,
                           "args": {"name": "compute"}})
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": COMM_TID,
                           "args": {"name": "comm"}})
            for t in rep.execution.timeline.get(d, []):
                events.append({"ph": "X", "name": t.action.label(), "cat": f"{t.lane},{t.action.kind}",
                               "pid": pid, "tid": COMPUTE_TID if t.lane == "compute" else COMM_TID,
                               "ts": round(t.start * 1000.0, 3), "dur": round((t.end - t.start) * 1000.0, 3),
                               "args": _args(t.action, t.step)})
    return events


def write_trace(results: Sequence[Tuple[Plan, object]], path: str) -> None:
    """Write Chrome/Perfetto trace JSON (open in ui.perfetto.dev or chrome://tracing)."""
    obj = {"traceEvents": trace_events(results), "displayTimeUnit": "ms",
           "otherData": {"schedules": [_schedule_name(p, k) for k, (p, _) in enumerate(results)],
                         "step_ms": [round(r.makespan_ms, 6) for _, r in results]}}
    with open(path, "w") as f:
        json.dump(obj, f)


# -- PNG -------------------------------------------------------------------------------------------
_PALETTE = {  # (first region / encoder, pipelined body)
    F: ("#f4a340", "#4c78a8"),
    R: ("#c9a0dc", "#c9a0dc"),
    B: ("#d95f5f", "#54a24b"),
    BW: ("#d95f5f", "#54a24b"),
    W: ("#f2b8b8", "#a6d49f"),
}
_COMM = "#9e9e9e"
_WAIT = "#e0e0e0"
_PAIR = "#7b1fa2"  # outline of DualPipeV overlap pairs


def _color(a: Action, body: str) -> str:
    enc, llm = _PALETTE.get(a.kind, ("#777777", "#777777"))
    return llm if a.region == body else enc


def _last_step(rep) -> Tuple[Dict[int, list], float]:
    """The timed actions of the last executed step, shifted so that step starts at 0."""
    tl = rep.execution.timeline
    last = max((t.step for ts in tl.values() for t in ts), default=0)
    items = {d: [t for t in ts if t.step == last] for d, ts in tl.items()}
    t0 = min((t.start for ts in items.values() for t in ts if t.lane == "compute"), default=0.0)
    return items, t0


def write_png(results: Sequence[Tuple[Plan, object]], path: str, title: str = "") -> None:
    """Gantt chart: one panel per schedule (shared time axis), one row per device with a thin comm lane."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    n = len(results)
    rows = [p.num_devices for p, _ in results]
    fig_h = sum(0.42 * r + 1.0 for r in rows) + 1.0
    fig, axes = plt.subplots(n, 1, figsize=(15, fig_h), sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [r + 1.2 for r in rows]})
    span = 0.0
    spilled = paired = False
    regions_seen: Dict[str, str] = {}
    for k, (plan, rep) in enumerate(results):
        ax = axes[k][0]
        body = plan.regions()[-1] if plan.regions() else None
        items, t0 = _last_step(rep)
        P = plan.num_devices
        for d in range(P):
            y = P - 1 - d
            for t in items.get(d, []):
                a, s, w = t.action, t.start - t0, t.end - t.start
                span = max(span, t.end - t0)
                if t.lane == "compute":
                    ax.broken_barh([(s, w)], (y + 0.22, 0.68), facecolors=_color(a, body),
                                   edgecolors=_PAIR if a.pair is not None else "black",
                                   linewidth=1.2 if a.pair is not None else 0.3, hatch="///" if a.step else None)
                    paired = paired or a.pair is not None
                    spilled = spilled or bool(a.step)
                    regions_seen.setdefault(a.region, "body" if a.region == body else "enc")
                    if a.micro is not None and w > 0:
                        ax.text(s + w / 2, y + 0.56, str(a.micro), ha="center", va="center", fontsize=6,
                                clip_on=True)
                elif w > 0:
                    ax.broken_barh([(s, w)], (y + 0.02, 0.16), facecolors=_WAIT if a.kind == "RECV" else _COMM,
                                   edgecolors="none")
        ax.set_yticks([P - 1 - d + 0.5 for d in range(P)])
        ax.set_yticklabels([f"dev {d}" for d in range(P)], fontsize=8)
        ax.set_ylim(0, P)
        ax.set_title(f"{_schedule_name(plan, k)}: step {rep.makespan_ms:.1f} ms, bubble {rep.bubble_ratio:.1%}",
                     fontsize=10, loc="left")
        ax.grid(axis="x", linestyle=":", linewidth=0.5)
    axes[-1][0].set_xlim(0, span * 1.01 if span > 0 else 1.0)
    axes[-1][0].set_xlabel("time (ms); label = micro-batch")
    enc_names = [r for r, kind in regions_seen.items() if kind == "enc"]
    body_names = [r for r, kind in regions_seen.items() if kind == "body"]
    enc = "/".join(enc_names) or "encoder"
    llm = "/".join(body_names) or "body"
    handles = [Patch(facecolor=_PALETTE[F][1], edgecolor="black", label=f"F {llm}"),
               Patch(facecolor=_PALETTE[BW][1], edgecolor="black", label=f"B/BW {llm}"),
               Patch(facecolor=_PALETTE[W][1], edgecolor="black", label=f"W {llm}"),
               Patch(facecolor=_PALETTE[F][0], edgecolor="black", label=f"F {enc}")]
    if any(t.action.kind in BACKWARD_KINDS and t.action.kind != R
           and t.action.region != (p.regions()[-1] if p.regions() else None)
           for p, r in results for ts in r.execution.timeline.values() for t in ts if t.lane == "compute"):
        handles.append(Patch(facecolor=_PALETTE[BW][0], edgecolor="black", label=f"B/BW {enc}"))
    recomputed = dict.fromkeys(t.action.region for _, r in results for ts in r.execution.timeline.values()
                               for t in ts if t.action.kind == R)
    if recomputed:   # a central backward's or a recomputed chunk's forward again
        handles.append(Patch(facecolor=_PALETTE[R][0], edgecolor="black",
                             label=f"R {'/'.join(recomputed)} (recompute)"))
    if paired:
        handles.append(Patch(facecolor="white", edgecolor=_PAIR, linewidth=1.2,
                             label="overlap pair (F + B of two micro-batches; run in sequence here)"))
    if spilled:
        handles.append(Patch(facecolor=_PALETTE[F][0], edgecolor="black", hatch="///",
                             label=f"F {enc} for the next step (spill)"))
    handles += [Patch(facecolor=_COMM, label="send / collective"), Patch(facecolor=_WAIT, label="recv wait")]
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 8), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1.0))
    if title:
        fig.suptitle(title, y=1.03, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
