"""Every flag of ``train``, ``bench``, ``profile`` and ``tune`` is honoured on each path it is accepted on
(its effect seen at the launch, in-process with a stand-in launcher) or refused there before anything runs,
naming the flag and the path (issue 40: ``train --reference --save-dir D --save-every 2`` exited 0 and
saved nothing). The walk is over the parser's own flags: a new flag fails it until it is classified."""
import json
import os

import pytest

import hyperparallel.launch as L
from hyperparallel import cli
from hyperparallel.commands import flags as F
from hyperparallel.commands import train as T
from hyperparallel.launch import LaunchResult

from helpers import ROOT, recipe
from fake_bench import FakeLauncher

TINY = recipe("tiny_mllm.yaml")
HEAVY = recipe("bench_encoder_heavy.yaml")

#: a sample command-line value of every flag (by command and dest); {tmp} is the test's folder
SAMPLE = {
    "train": {"schedule": ["--schedule", "1f1b"], "steps": ["--steps", "2"], "overrides": ["--set", "train.lr=0.02"],
              "reference": ["--reference"], "compile": ["--compile", "eager"], "run_dir": ["--run-dir", "{tmp}/run"],
              "save_dir": ["--save-dir", "{tmp}/ckpt"], "save_every": ["--save-every", "1"],
              "save_format": ["--save-format", "ckpt"], "resume": ["--resume"],
              "resume_from": ["--resume-from", "{tmp}/ckpt"], "no_digest": ["--no-digest"],
              "timeout": ["--timeout", "77"], "overwrite_save_dir": ["--overwrite-save-dir"]},
    "bench": {"schedule": ["--schedule", "1f1b"], "steps": ["--steps", "3"], "warmup": ["--warmup", "1"],
              "repeats": ["--repeats", "2"], "max_contention": ["--max-contention", "1"],
              "overrides": ["--set", "train.lr=0.02"], "profile": ["--profile", HEAVY],
              "recipe_profile": ["--recipe-profile"], "measure_profile": ["--measure-profile"],
              "profile_schedule": ["--profile-schedule", "none"], "profile_samples": ["--profile-samples", "3"],
              "rotate": ["--rotate", "launches"], "save_profile": ["--save-profile", "{tmp}/p.yaml"],
              "out": ["--out", "{tmp}/b.json"], "png": ["--png", "{tmp}/b.png"], "compile": ["--compile", "eager"],
              "run_dir": ["--run-dir", "{tmp}/run"], "timeout": ["--timeout", "77"]},
    "profile": {"schedule": ["--schedule", "1f1b"], "in_pipeline": ["--in-pipeline"],
                "overrides": ["--set", "train.lr=0.02"], "out": ["--out", "{tmp}/p.yaml"],
                "samples": ["--samples", "3"], "repeats": ["--repeats", "2"], "compile": ["--compile", "eager"],
                "run_dir": ["--run-dir", "{tmp}/run"], "timeout": ["--timeout", "77"]},
    "tune": {"memory_limit": ["--memory-limit", "100"], "top": ["--top", "2"], "out": ["--out", "{tmp}/t.yaml"],
             "json": ["--json"], "overrides": ["--set", "train.lr=0.02"], "profile": ["--profile", HEAVY],
             "verify": ["--verify", "1"], "steps": ["--steps", "3"], "warmup": ["--warmup", "1"],
             "run_dir": ["--run-dir", "{tmp}/run"], "timeout": ["--timeout", "77"]},
}

_RESUME = "test_checkpoint_resume.py::test_resume_takes_newest_complete_step_and_equals_uninterrupted"
#: path -> (its command line, {flag dest: the test that sees its effect}, {flag dest refused on it})
PATHS = {
    "train pipeline": (["train", TINY], {
        **{d: "test_train_pipeline_flags_reach_the_launch" for d in
           ("schedule", "steps", "overrides", "compile", "run_dir", "save_dir", "timeout")},
        "reference": "test_train_reference_flags_reach_the_reference",
        "resume_from": "test_checkpoint_resume.py::test_start_from_single_process_mindspore_file",
        "resume": _RESUME}, {"save_every", "save_format", "no_digest", "overwrite_save_dir"}),
    "train pipeline --save-dir": (["train", TINY, "--save-dir", "{tmp}/ckpt"], {
        **{d: "test_train_pipeline_flags_reach_the_launch" for d in
           ("schedule", "steps", "overrides", "compile", "run_dir", "save_dir", "save_every", "save_format",
            "no_digest", "timeout")},
        "reference": "test_train_reference_flags_reach_the_reference", "resume": _RESUME,
        "overwrite_save_dir": "test_train_guards.py::test_overwrite_removes_the_old_step_directories_only",
        "resume_from": "test_checkpoint_resume.py::test_start_from_single_process_mindspore_file"}, set()),
    "train --reference": (["train", TINY, "--reference"], {
        **{d: "test_train_reference_flags_reach_the_reference" for d in ("reference", "steps", "overrides", "run_dir")},
        "resume_from": "test_checkpoint_resume.py::test_reference_resumed_from_a_step_equals_the_uninterrupted_one"},
        {"schedule", "compile", "save_dir", "save_every", "save_format", "resume", "no_digest", "timeout",
         "overwrite_save_dir"}),
    "train --reference --resume-from": (["train", TINY, "--reference", "--resume-from", "{tmp}/ckpt"], {
        **{d: "test_train_reference_flags_reach_the_reference" for d in ("reference", "steps", "overrides", "run_dir")},
        "resume_from": "test_checkpoint_resume.py::test_reference_resumed_from_a_step_equals_the_uninterrupted_one",
        "no_digest": "test_train_reference_flags_reach_the_reference"},
        {"schedule", "compile", "save_dir", "save_every", "save_format", "resume", "timeout", "overwrite_save_dir"}),
    "bench, profile measured": (["bench", TINY], {
        **{d: "test_bench_flags_reach_the_launches" for d in
           ("schedule", "steps", "warmup", "repeats", "max_contention", "overrides", "rotate", "out", "png",
            "compile", "run_dir", "timeout", "measure_profile", "profile_schedule", "profile_samples",
            "save_profile")},
        "profile": "test_bench.py::test_profile_then_bench_on_two_ranks",
        "recipe_profile": "test_bench.py::test_bench_json_png_and_alternation"}, set()),
    "bench --recipe-profile": (["bench", TINY, "--recipe-profile"], {
        **{d: "test_bench_flags_reach_the_launches" for d in
           ("schedule", "steps", "warmup", "repeats", "max_contention", "overrides", "rotate", "out", "png",
            "compile", "run_dir", "timeout")},
        "recipe_profile": "test_bench.py::test_bench_json_png_and_alternation",
        # refused as a combination already (give one of them)
        "profile": "test_bench.py::test_bench_refuses_bad_input_before_launch",
        "measure_profile": "test_bench.py::test_bench_refuses_bad_input_before_launch",
        "profile_schedule": "test_bench.py::test_profile_schedule_needs_a_measured_profile",
        "save_profile": "test_bench.py::test_bench_refuses_bad_input_before_launch"}, {"profile_samples"}),
    "bench --compile twice": (["bench", TINY, "--recipe-profile", "--compile", "eager", "--compile", "jit"], {
        **{d: "test_bench_flags_reach_the_launches" for d in
           ("schedule", "steps", "warmup", "repeats", "max_contention", "overrides", "rotate", "run_dir", "timeout")},
        **{d: "test_bench.py::test_bench_compares_compile_modes_every_schedule_under_each" for d in
           ("compile", "out", "recipe_profile")},
        "profile": "test_bench.py::test_bench_refuses_bad_input_before_launch",
        "measure_profile": "test_bench.py::test_bench_refuses_bad_input_before_launch",
        "profile_schedule": "test_bench.py::test_profile_schedule_needs_a_measured_profile",
        "save_profile": "test_bench.py::test_bench_refuses_bad_input_before_launch"}, {"profile_samples", "png"}),
    "profile": (["profile", TINY], {
        **{d: "test_profile_flags_reach_the_launch" for d in
           ("schedule", "overrides", "out", "samples", "repeats", "compile", "run_dir", "timeout")},
        "in_pipeline": "test_bench.py::test_profile_then_bench_on_two_ranks"}, set()),
    "tune": (["tune", TINY], {
        "memory_limit": "test_tune.py::test_a_memory_limit_no_candidate_meets_names_the_smallest_peak",
        "top": "test_tune.py::test_table_counts_offset_and_overlay_that_simulate_and_plan_read_as_is",
        "out": "test_tune.py::test_table_counts_offset_and_overlay_that_simulate_and_plan_read_as_is",
        "json": "test_tune.py::test_json_ranks_candidates_at_least_as_fast_as_every_named_schedule",
        "overrides": "test_tune.py::test_unknown_set_key_is_refused_and_nothing_is_written",
        "profile": "test_tune.py::test_profile_at_another_micro_batch_size",
        "verify": "test_tune.py::test_verify_runs_the_cases_in_one_launch_and_compares_the_orders"},
        {"steps", "warmup", "run_dir", "timeout"}),
    "tune --verify": (["tune", TINY, "--verify", "1"], {
        **{d: "test_tune.py::test_verify_runs_the_cases_in_one_launch_and_compares_the_orders" for d in
           ("verify", "steps", "warmup", "run_dir", "timeout")},
        "memory_limit": "test_tune.py::test_a_memory_limit_no_candidate_meets_names_the_smallest_peak",
        "top": "test_tune.py::test_table_counts_offset_and_overlay_that_simulate_and_plan_read_as_is",
        "out": "test_tune.py::test_table_counts_offset_and_overlay_that_simulate_and_plan_read_as_is",
        "json": "test_tune.py::test_json_ranks_candidates_at_least_as_fast_as_every_named_schedule",
        "overrides": "test_tune.py::test_unknown_set_key_is_refused_and_nothing_is_written",
        "profile": "test_tune.py::test_profile_at_another_micro_batch_size"}, set()),
}


def _dests(command: str):
    sub = F._subparser(cli.build_parser(), command)
    return {a.dest for a in sub._actions if a.option_strings and a.dest != "help"}


def _fill(words, tmp):
    return [w.replace("{tmp}", str(tmp)) for w in words]


def _argv(path: str, dest: str, tmp):
    base = PATHS[path][0]
    extra = [] if dest in F.given_flags(cli.build_parser, _fill(base, tmp)) else SAMPLE[base[0]][dest]
    return _fill(base + extra, tmp)


def _has_test(ref: str) -> bool:
    mod, _, name = ref.rpartition("::")
    paths = [os.path.join(ROOT, "tests", kind, mod or "test_cli_flags.py") for kind in ("unit", "integration")]
    return any(os.path.isfile(p) and f"def {name}(" in open(p).read() for p in paths)


def test_every_flag_of_every_path_is_classified_and_the_code_agrees(tmp_path):
    for path, (base, honoured, refused) in PATHS.items():
        dests = _dests(base[0])
        assert set(SAMPLE[base[0]]) == dests, (base[0], dests ^ set(SAMPLE[base[0]]))
        assert not set(honoured) & refused, path
        assert set(honoured) | refused == dests, (path, dests - set(honoured) - refused)
        for dest in dests:
            argv = _argv(path, dest, tmp_path)
            args = cli.build_parser().parse_args(argv)
            found = {d for d, _, _ in F.refusals(base[0], args, F.given_flags(cli.build_parser, argv))}
            assert (dest in found) == (dest in refused), (path, dest, found)
        assert all(_has_test(t) for t in honoured.values()), path


@pytest.fixture
def no_launch(monkeypatch):
    def launch(*a, **k):
        raise AssertionError("launched")
    monkeypatch.setattr(L, "launch", launch)
    monkeypatch.setattr(T, "_run_reference", launch)


def test_unhonoured_flags_are_refused_naming_the_flag_and_the_path(no_launch, tmp_path, capsys):
    parser = cli.build_parser()
    for path, (base, _, refused) in PATHS.items():
        for dest in sorted(refused):
            argv = _argv(path, dest, tmp_path)
            assert cli.main(argv) == 2, (path, dest)
            err = capsys.readouterr().err.strip().splitlines()
            flag = F.flag_name(parser, base[0], dest)
            assert len(err) == 1 and err[0].startswith(f"error: {flag}: not honoured "), (path, err)
            where = {"train --reference": "with --reference", "train --reference --resume-from": "with --reference",
                     "bench --recipe-profile": "with --profile or "
                     "--recipe-profile", "tune": "without --verify", "train pipeline": "without --save-dir",
                     "bench --compile twice": "with --profile or --recipe-profile" if dest == "profile_samples" else
                     "with --compile given twice"}[path]
            if path == "train --reference" and dest == "no_digest":   # honoured with --resume-from
                where = "without --save-dir, --resume or --resume-from"
            assert where in err[0], err[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "ckpt").exists()


def test_the_issue_command_is_refused_and_saves_nothing(no_launch, tmp_path, capsys):
    """``train --reference --save-dir D --save-every 2`` (issue 40) exited 0 and saved nothing."""
    assert cli.main(["train", TINY, "--reference", "--save-dir", str(tmp_path / "D"), "--save-every", "2",
                     "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --save-dir: not honoured with --reference: the reference saves no "
                          "checkpoint") and err.endswith("(1 more: --save-every)"), err
    assert not (tmp_path / "D").exists() and not (tmp_path / "run").exists()


def test_train_pipeline_flags_reach_the_launch(monkeypatch, tmp_path):
    seen = {}

    def launch(job, world, log_dir, timeout_s=0, **kw):
        seen.update(job=job, log_dir=log_dir, timeout_s=timeout_s)
        return LaunchResult(returncode=0, log_dir=log_dir, wall_s=1.0)
    monkeypatch.setattr(L, "launch", launch)
    assert cli.main(["train", TINY, "--schedule", "1f1b", "--steps", "2", "--set", "train.lr=0.02", "--compile",
                     "eager", "--run-dir", str(tmp_path / "run"), "--save-dir", str(tmp_path / "ckpt"),
                     "--save-every", "1", "--save-format", "ckpt", "--no-digest", "--timeout", "77"]) == 0
    case = seen["job"]["cases"][0]
    assert (case["schedule"], case["steps"], case["raw"]["train"]["lr"], case["raw"]["mpipe"]["compile"]) == \
        ("1f1b", 2, 0.02, "eager")
    assert case["run_dir"] == str(tmp_path / "run") and seen["log_dir"] == str(tmp_path / "run" / "logs")
    assert (case["save_dir"], case["save_every"], case["save_format"], case["digests"]) == \
        (str(tmp_path / "ckpt"), 1, "ckpt", False)
    assert seen["timeout_s"] == 77


def test_train_reference_flags_reach_the_reference(monkeypatch, tmp_path):
    seen = {}

    def reference(recipe, rc, steps, run_dir, schedule_steps=0, source=None):
        seen.update(lr=rc.train.lr, steps=steps, run_dir=run_dir, source=source)
        return 0
    monkeypatch.setattr(T, "_run_reference", reference)
    monkeypatch.setattr(L, "launch", lambda *a, **k: pytest.fail("the reference launches no ranks"))
    assert cli.main(["train", TINY, "--reference", "--steps", "2", "--set", "train.lr=0.02",
                     "--run-dir", str(tmp_path / "ref")]) == 0
    assert seen == {"lr": 0.02, "steps": 2, "run_dir": str(tmp_path / "ref"), "source": None}
    # --resume-from reaches the reference as the resolved checkpoint; --no-digest skips its digests there
    import mindspore as ms
    import numpy as np
    import hyperparallel.runtime.ckpt_files as CF
    step = str(tmp_path / "single.safetensors")
    ms.save_checkpoint([{"name": "w", "data": ms.Tensor(np.zeros(2, np.float32))}], step, format="safetensors")
    digests, real = [], CF.resolve

    def resolve(path, digests_flag=True, **kw):
        digests.append(kw.get("digests", digests_flag))
        return real(path, **kw)
    monkeypatch.setattr(CF, "resolve", resolve)
    for extra, want in (([], True), (["--no-digest"], False)):
        assert cli.main(["train", TINY, "--reference", "--resume-from", step, "--run-dir", str(tmp_path / "ref"),
                         *extra]) == 0
        assert seen["source"].path == step and seen["source"].step == 0 and digests[-1] is want


class _Recording(FakeLauncher):
    """The stand-in launcher of test_bench, recording every job it runs (a rotation's parts too)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __call__(self, job, world, log_dir, timeout_s=0, echo=True, script=None):
        self.calls.append((job, log_dir, timeout_s))
        return super().__call__(job, world, log_dir, timeout_s, echo, script)


def _jobs(calls, mode):
    return [job for job, _, _ in calls if job["mode"] == mode]


def test_bench_flags_reach_the_launches(monkeypatch, tmp_path):
    fake = _Recording()
    monkeypatch.setattr(L, "launch", fake)
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    assert cli.main(["bench", TINY, "--schedule", "1f1b", "--schedule", "transpose", "--steps", "3", "--warmup", "2",
                     "--repeats", "2", "--max-contention", "1", "--set", "train.lr=0.02", "--rotate", "launches",
                     "--recipe-profile", "--out", str(out), "--png", str(png), "--compile", "eager",
                     "--run-dir", str(tmp_path / "run"), "--timeout", "77"]) == 0
    benches = _jobs(fake.calls, "bench")
    assert [j["name"] for j in benches] == ["1f1b", "transpose"] * 2 and all(j["steps"] == 5 for j in benches)
    assert all(j["raw"]["train"]["lr"] == 0.02 and j["raw"]["mpipe"]["compile"] == "eager" for j in benches)
    assert all(t == 77 and d.startswith(str(tmp_path / "run")) for _, d, t in fake.calls)
    res = json.loads(out.read_text())
    assert (res["steps"], res["warmup"], res["repeats"], res["max_contention"], res["rotate"]) == (3, 2, 2, 1.0,
                                                                                                     "launches")
    assert png.stat().st_size > 0
    # the profile measured in the run: its samples, its reference schedule, where it is written
    fake = _Recording()
    monkeypatch.setattr(L, "launch", fake)
    prof = tmp_path / "p.yaml"
    assert cli.main(["bench", TINY, "--schedule", "1f1b", "--steps", "1", "--warmup", "2", "--repeats", "1",
                     "--measure-profile", "--profile-schedule", "none", "--profile-samples", "3",
                     "--save-profile", str(prof), "--run-dir", str(tmp_path / "run2")]) == 0
    assert [j["steps"] for j in _jobs(fake.calls, "profile")] == [3]
    assert not [j for j in _jobs(fake.calls, "bench") if j.get("action_times")]   # --profile-schedule none
    assert prof.is_file()


def test_profile_flags_reach_the_launch(monkeypatch, tmp_path):
    fake = _Recording()
    monkeypatch.setattr(L, "launch", fake)
    out = tmp_path / "p.yaml"
    assert cli.main(["profile", TINY, "--schedule", "1f1b", "--set", "train.lr=0.02", "--out", str(out),
                     "--samples", "3", "--repeats", "2", "--compile", "eager", "--run-dir", str(tmp_path / "run"),
                     "--timeout", "77"]) == 0
    (job, log_dir, timeout_s), = fake.calls
    assert (job["steps"], job["passes"], job["raw"]["train"]["lr"], job["raw"]["mpipe"]["compile"]) == \
        (3, 2, 0.02, "eager")
    assert job["plan"]["meta"]["schedule_name"] == "1f1b"
    assert log_dir == str(tmp_path / "run" / "logs") and timeout_s == 77 and out.is_file()
