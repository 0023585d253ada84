"""Bar chart of a bench: measured median step time (whiskers: quartiles of the kept steps)
next to the cost model's prediction, with the ratio against the first schedule."""
from __future__ import annotations

from typing import List


def bar_chart(rows: List[dict], path: str, title: str = "") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(rows)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.9 * n + 2), 4.2))
    xs = range(n)
    w = 0.38
    meas = [r["median_step_s"] * 1e3 for r in rows]
    lo = [max(0.0, m - r.get("q25_step_s", r["median_step_s"]) * 1e3) for m, r in zip(meas, rows)]
    hi = [max(0.0, r.get("q75_step_s", r["median_step_s"]) * 1e3 - m) for m, r in zip(meas, rows)]
    ax.bar([x - w / 2 for x in xs], meas, w, yerr=[lo, hi], capsize=4, color="#4C72B0",
           label="measured (median; whiskers: quartiles)")
    pred = [(r["predicted_step_s"] or 0.0) * 1e3 for r in rows]
    ax.bar([x + w / 2 for x in xs], pred, w, color="#DD8452", hatch="//", alpha=0.85,
           label="cost model (measured profile)")
    top = max([m + h for m, h in zip(meas, hi)] + pred) if rows else 1.0
    for x, r, m in zip(xs, rows, meas):
        err = "" if r.get("error") is None else f"\npred {r['error'] * 100:+.0f}%"
        ax.text(x, max(m + hi[x], pred[x]) + 0.02 * top, f"{r['ratio']:.2f}x{err}", ha="center", va="bottom",
                fontsize=9)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["schedule"] for r in rows], fontsize=8)
    ax.set_ylabel("step time (ms)")
    ax.set_ylim(0, top * 1.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
