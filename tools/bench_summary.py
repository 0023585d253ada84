"""Markdown summary of a ``hyperparallel bench --out FILE.json`` result: the table, the ratio of the
first schedule's median step to each other's, its spread over the repeats (per-launch medians, paired
by repeat) and the cost model's prediction errors.

    python tools/bench_summary.py docs/bench_mf_llama_2rank.json
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hyperparallel.bench.bench import format_table  # noqa: E402


def _kept(row: dict) -> str:
    if row.get("all_steps_kept_busy_machine"):
        return f"all {row['samples']} steps of `{row['schedule']}` (too few undisturbed: busy machine)"
    return f"{row['samples']} undisturbed steps of `{row['schedule']}`"


def summary(result: dict) -> str:
    rows = result["schedules"]
    base = rows[0]
    out = [format_table(rows), ""]
    for r in rows[1:]:
        per = [b / t for b, t in zip(base.get("repeat_medians_s", []), r.get("repeat_medians_s", []))]
        spread = (f"; per repeat {', '.join(f'{x:.2f}x' for x in per)} (min {min(per):.2f}x, max {max(per):.2f}x)"
                  if per else "")
        out.append(f"- `{r['schedule']}` vs `{base['schedule']}`: {r['ratio']:.2f}x faster "
                   f"(medians over {_kept(r)} and {_kept(base)}){spread}")
    for r in rows:
        if r.get("error") is not None:
            out.append(f"- `{r['schedule']}`: predicted {r['predicted_step_s'] * 1e3:.1f} ms, measured "
                       f"{r['median_step_s'] * 1e3:.1f} ms, error {r['error'] * 100:+.1f}%")
    out.append(f"- command: `{result.get('command', '')}`")
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(summary(json.load(f)))
