"""A stand-in for the launcher of ``hyperparallel bench`` and ``profile`` (no msrun, no MindSpore): plausible
per-rank results written where the real ranks write theirs (``tests/unit/test_cli_flags.py`` and
``tests/integration/test_bench.py`` drive the commands with it)."""
import json
import os

from hyperparallel.bench import profile as PR
from hyperparallel.launch import LaunchResult


def rank_result(rank, step_times, n_actions=10, interp=0.001):
    """One rank's bench result (its ``rank_N.json``) with these step times."""
    steps = [{"step": i, "step_s": t, "program_s": t * 0.9, "compute_s": t * 0.7, "comm_s": t * 0.15,
              "data_s": t * 0.04, "accumulate_s": 0.0, "optimizer_s": t * 0.05, "loss_reduce_s": t * 0.05 - interp,
              "interp_s": interp, "loss": 1.0} for i, t in enumerate(step_times)]
    return {"rank": rank, "device": rank, "n_actions": n_actions, "steps": steps,
            "base_rss_mb": 300.0, "end_rss_mb": 310.0, "peak_rss_mb": 320.0}


def profile_rank():
    """One rank's ``hyperparallel profile`` measurements of the tiny MLLM's cut."""
    acts = [dict(mode="fused", kind=k, region=r, chunk=c, micro=0, step=0, ms=ms)
            for k, r, c, ms in [("F", "vision", 0, 8.0), ("BW", "vision", 0, 16.0), ("F", "llm", 0, 1.0),
                                ("F", "llm", 1, 1.0), ("BW", "llm", 0, 2.0), ("BW", "llm", 1, 2.0)]]
    acts += [dict(mode="split", kind="B", region=r, chunk=c, micro=0, step=0, ms=1.0)
             for r, c in [("vision", 0), ("llm", 0), ("llm", 1)]]
    return {"actions": acts, "data_ms": [0.5], "output_bytes": {"vision": [1048], "llm": [2097]},
            "activation_mb": {"vision/0": 1.0, "llm/0": 0.1, "llm/1": 0.1},
            "param_mb": {"vision/0": 1.0, "llm/0": 0.1, "llm/1": 0.1},
            "output_mb": {"vision": 0.001, "llm": 0.002},
            "link": {"latency_ms": 0.1, "bandwidth_gb_s": 0.5, "points": []}}


class FakeLauncher:
    """Writes plausible per-rank results instead of running msrun; records the launch order."""

    def __init__(self):
        self.order = []

    def __call__(self, job, world, log_dir, timeout_s=0, echo=True, script=None):
        assert script == PR.BENCH_WORKER
        if job["mode"] == "rotation":   # one launch: the profile, then the cases (in rotation)
            self.order.append("launch")
            for sub in ([job["profile"]] if job["profile"] else []) + job["cases"]:
                self(sub, world, log_dir, timeout_s, echo, script)
            return LaunchResult(returncode=0, log_dir=log_dir, wall_s=1.0)
        os.makedirs(job["out_dir"], exist_ok=True)
        if job["mode"] == "profile":
            self.order.append("profile")
            for r in range(world):
                with open(os.path.join(job["out_dir"], f"rank_{r}.json"), "w") as f:
                    json.dump(profile_rank(), f)
            return LaunchResult(returncode=0, log_dir=log_dir, wall_s=1.0)
        assert job["mode"] == "bench"
        self.order.append(job["name"])
        t = 0.3 if job["name"] == "1f1b" else 0.2
        os.makedirs(job["out_dir"], exist_ok=True)
        for r in range(world):
            with open(os.path.join(job["out_dir"], f"rank_{r}.json"), "w") as f:
                res = rank_result(r, [5.0] * 2 + [t] * (job["steps"] - 2))
                if job.get("action_times"):  # a reference run: the vision forward, timed in the pipeline
                    res["action_times"] = [dict(step=s, kind="F", region="vision", chunk=0, micro=0, ms=20.0)
                                           for s in range(job["steps"])] if r == 0 else []
                json.dump(res, f)
        return LaunchResult(returncode=0, log_dir=log_dir, wall_s=1.0)
