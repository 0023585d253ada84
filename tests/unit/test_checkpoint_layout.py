"""Checkpoint layout, owners, name checks and refusals before launch (no msrun job).

Checkpoints here are written in this process by the ranks' own :class:`Saver`, one fake rank
after the other (a no-op barrier), so the files are exactly what a job writes.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest

from hyperparallel.runtime import ckpt_files as cf
from hyperparallel.recipe import derive_recipe
from hyperparallel.recipe import load_recipe
from hyperparallel import testing
from hyperparallel.testing import FakeComm, in_process_ranks

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "tiny_mllm.yaml")


def plan_of(schedule, *overrides):
    return derive_recipe(load_recipe(RECIPE, overrides=list(overrides)), schedule)


@pytest.mark.parametrize("schedule,overrides", [
    ("transpose", ()), ("transpose(backward=central)", ()), ("1f1b", ()),
    ("interleaved", ("parallel_config.pp_interleave_num=2",)),
    ("transpose", ("parallel_config.pipeline_stage=4",)),
    ("transpose", ("parallel_config.data_parallel=2",)),
    ("transpose", ("mpipe.profile.regions.0.trainable=false",)),
])
def test_every_chunk_has_one_owner_that_holds_and_updates_it(schedule, overrides):
    from hyperparallel.mpipe import ir
    plan = plan_of(schedule, *overrides)
    owners = cf.chunk_owners(plan)
    assert set(owners) == {(c.region, c.index) for c in plan.chunks}
    for c in plan.chunks:
        d = owners[(c.region, c.index)]
        assert d in c.devices
        prog = plan.programs[d]
        updates = any(a.kind in (ir.B, ir.BW, ir.W) and a.region == c.region and a.chunk == c.index
                      for a in prog) or any(a.kind == ir.ALLREDUCE and a.tensor == ir.WGRAD
                                            and a.region == c.region for a in prog)
        assert updates == plan.trainable.get(c.region, True), (c, d)
    assert all(r % plan.data_parallel == 0 for r in cf.writers(plan))  # dp copies: written by dp index 0
    if len(plan.chunk("vision", 0).devices) > 1:  # transpose: replicas on every rank, one writer
        assert owners[("vision", 0)] == min(plan.chunk("vision", 0).devices) or "central" in schedule


def test_central_backward_owner_is_the_device_that_updates():
    plan = plan_of("transpose(backward=central)")
    from hyperparallel.mpipe import ir
    w = {d for d, p in plan.programs.items() for a in p if a.kind in (ir.W, ir.BW) and a.region == "vision"}
    assert cf.chunk_owners(plan)[("vision", 0)] == min(w)


def test_check_names():
    params = {"a.w": (2, 3), "a.b": (3,)}
    state = {"moment1.a.w": (2, 3), "moment1.a.b": (3,), "beta1_power": (), "learning_rate": ()}
    full = dict(params, **state)
    assert cf.check_names(full, params, state, ("learning_rate",)) == ([], True)
    assert cf.check_names(params, params, state, ("learning_rate",)) == ([], False)  # fresh optimizer
    problems, _ = cf.check_names({"a.w": (2, 4), "x.y": (1,), "moment1.x.y": (1,)}, params, state)
    text = "; ".join(problems)
    assert "missing parameters: a.b" in text and "wrong shapes: a.w [2, 4] (model [2, 3])" in text
    assert "names not in this model: moment1.x.y, x.y" in text
    problems, load = cf.check_names(dict(params, beta1_power=()), params, state, ("learning_rate",))
    assert load and problems == ["optimizer state missing: moment1.a.b, moment1.a.w"]
    many = {f"l.{i}.w": (1,) for i in range(9)}
    problems, _ = cf.check_names({}, many, {})
    assert problems[0].endswith("... (9 in all)") and problems[0].count("l.") == 4


# ---------------------------------------------------------------- written by the ranks' Saver
def _ranks(schedule="transpose", overrides=()):
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    return in_process_ranks(RECIPE, schedule, overrides)


def write_checkpoint(save_dir, step, fmt="safetensors", schedule="transpose", overrides=()):
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    return testing.write_checkpoint(RECIPE, save_dir, step, fmt, schedule, overrides)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ck"))
    path, ranks = write_checkpoint(d, 3)
    return d, path, ranks


def test_step_dir_layout_and_names_written_once(saved):
    save_dir, path, ranks = saved
    assert sorted(os.listdir(path)) == ["COMPLETE", "meta.json", "rank_0.safetensors", "rank_1.safetensors"]
    meta = cf.read_meta(path)
    assert (meta["step"], meta["P"], meta["D"], meta["V"], meta["schedule"]) == (3, 2, 1, 1, "transpose")
    assert meta["data_position"] == {"next_step": 3, "micro_batch": 0, "micro_batches_per_step": 4, "step": 3}
    assert meta["optimizer"] == "adam" and meta["recipe_hash"]
    heads = [cf.safetensors_header(os.path.join(path, f)) for f in meta["files"]]
    assert not set(heads[0]) & set(heads[1])  # the encoder replica of rank 1 is not written again
    names = set(heads[0]) | set(heads[1])
    params = {p.name for _, chunks, _, _ in ranks for c in chunks.values() for p in c.get_parameters()}
    state = {n for _, _, opt, _ in ranks for n in opt.state()}
    assert names == params | state
    assert {"moment1.llm.0.attn.wq", "moment2.vision.0.attn.wq", "beta1_power", "global_step"} <= names


def test_resolve_newest_complete_and_incomplete_ignored(saved, tmp_path):
    save_dir, path, _ = saved
    d = str(tmp_path / "ck")
    shutil.copytree(save_dir, d)
    shutil.copytree(os.path.join(d, "step_3"), os.path.join(d, "step_5"))
    os.remove(os.path.join(d, "step_5", "COMPLETE"))  # a save that did not finish
    src = cf.resolve(d)
    assert src.step == 3 and src.path == os.path.join(d, "step_3")
    assert src.ignored == [os.path.join(d, "step_5")]
    with pytest.raises(cf.CheckpointError, match="incomplete"):
        cf.resolve(os.path.join(d, "step_5"))
    f = os.path.join(d, "step_3", "rank_1.safetensors")
    os.chmod(f, 0o600)
    os.truncate(f, os.path.getsize(f) - 100)
    with pytest.raises(cf.CheckpointError, match="rank_1.safetensors: corrupt checkpoint file \\(truncated"):
        cf.resolve(d)


def test_restore_refuses_another_model(saved):
    from hyperparallel.runtime.checkpoint import restore
    _, path, _ = saved
    _, _, ranks = _ranks("transpose", ("model.llm_dim=64",))

    class Comm(FakeComm):
        def all_gather_object(self, obj):
            return [({p.name: tuple(p.shape) for c in ch.values() for p in c.get_parameters()},
                     {n: tuple(p.shape) for n, p in o.state().items()}) for _, ch, o, _ in ranks]
    comm, chunks, opt, _ = ranks[0]
    before = {p.name: p.asnumpy().copy() for c in chunks.values() for p in c.get_parameters()}
    with pytest.raises(cf.CheckpointError, match=r"step_3 does not fit this model: wrong shapes: "
                       r"llm\.-1\.embed\.pos \[14, 32\] \(model \[14, 64\]\), .* \(48 in all\)$"):
        restore(cf.resolve(path), Comm(0), chunks, opt)
    after = {p.name: p.asnumpy() for c in chunks.values() for p in c.get_parameters()}
    assert all((before[k] == after[k]).all() for k in before)  # nothing loaded


def test_corrupt_ckpt_file_is_named(tmp_path):
    from hyperparallel.runtime.checkpoint import _index
    path, _ = write_checkpoint(str(tmp_path / "ck"), 1, fmt="ckpt")
    f = os.path.join(path, "rank_0.ckpt")
    os.chmod(f, 0o600)
    os.truncate(f, 1000)
    with pytest.raises(cf.CheckpointError, match=r"rank_0.ckpt: 1000 bytes, meta.json records \d+ \(truncated"):
        cf.resolve(path)   # the size meta.json records: refused before anything is read
    with pytest.raises(cf.CheckpointError, match="rank_0.ckpt: corrupt checkpoint file"):
        _index(cf.Source(path, [f, os.path.join(path, "rank_1.ckpt")], 1, cf.read_meta(path)))   # a rank reading it


def train(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "hyperparallel", "train", RECIPE, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_cli_refuses_bad_checkpoints_before_launch(saved, tmp_path):
    save_dir, _, _ = saved
    d = str(tmp_path / "ck")
    shutil.copytree(save_dir, d)
    os.remove(os.path.join(d, "step_3", "COMPLETE"))
    p = train("--resume", "--save-dir", d, "--run-dir", str(tmp_path / "run"))
    assert p.returncode == 2 and p.stderr.startswith("error: --resume: no complete checkpoint in"), p.stderr
    assert "incomplete: step_3" in p.stderr
    f = os.path.join(d, "step_3", "rank_0.safetensors")
    os.chmod(f, 0o600)
    os.truncate(f, 50)
    p = train("--resume-from", f, "--run-dir", str(tmp_path / "run"))
    assert p.returncode == 2 and "--resume-from: " + f + ": corrupt checkpoint file" in p.stderr, p.stderr
    p = train("--resume", "--resume-from", f, "--save-dir", d, "--run-dir", str(tmp_path / "run"))
    assert p.returncode == 2 and "either --resume" in p.stderr
    p = train("--resume-from", str(tmp_path / "nope.safetensors"), "--run-dir", str(tmp_path / "run"))
    assert p.returncode == 2 and "no such checkpoint" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "run" / "logs").exists()  # nothing launched


def test_ckpt_command_lists_steps(saved, tmp_path):
    save_dir, _, _ = saved
    d = str(tmp_path / "ck")
    shutil.copytree(save_dir, d)
    shutil.copytree(os.path.join(d, "step_3"), os.path.join(d, "step_4"))
    os.remove(os.path.join(d, "step_4", "COMPLETE"))
    p = subprocess.run([sys.executable, "-m", "hyperparallel", "ckpt", d], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("step_3: complete, transpose P=2 V=1 D=1, 2 safetensors files, ")
    assert lines[0].endswith(", SHA-256 verified")
    assert lines[1] == "step_4: incomplete (ignored by --resume): no COMPLETE marker: not every rank finished writing it"
    assert lines[2] == "--resume would use step_3"
    for step, first in (("step_3", "step_3: complete, "), ("step_4", "step_4: incomplete")):   # STEP_DIR: that one
        p = subprocess.run([sys.executable, "-m", "hyperparallel", "ckpt", os.path.join(d, step)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and len(p.stdout.splitlines()) == 1 and p.stdout.startswith(first), p.stdout
    p = subprocess.run([sys.executable, "-m", "hyperparallel", "ckpt", d, "--merge", "x.npz"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("error: --merge:")


# -- integrity: one verdict for --resume, --resume-from and hyperparallel ckpt (issue 21) -----------------

@pytest.fixture
def two_steps(saved, tmp_path):
    """A save directory with step_3 (the module's) and a freshly written step_5."""
    save_dir, _, _ = saved
    d = str(tmp_path / "ck")
    shutil.copytree(save_dir, d)
    write_checkpoint(d, 5)
    return d, os.path.join(d, "step_5")


def _ckpt_cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "hyperparallel", "ckpt", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _edit_meta(step_path, **changes):
    m = cf.read_meta(step_path)
    m.update(changes)
    with open(os.path.join(step_path, "meta.json"), "w") as f:
        json.dump(m, f)


def _overwrite_weights(path, n=16):
    """n float32 values of the first tensor's data set to 1e30 (same size: only a digest can tell)."""
    import numpy as np
    with open(path, "rb") as f:
        (hn,) = struct.unpack("<Q", f.read(8))
    os.chmod(path, 0o600)
    with open(path, "r+b") as f:
        f.seek(8 + hn)
        f.write(np.full(n, 1e30, np.float32).tobytes())


def test_meta_json_records_a_digest_of_every_file_and_the_marker_one_of_meta(two_steps):
    d, s5 = two_steps
    meta = cf.read_meta(s5)
    assert sorted(meta["digests"]) == meta["files"] == ["rank_0.safetensors", "rank_1.safetensors"]
    for name, rec in meta["digests"].items():
        assert rec == {"bytes": os.path.getsize(os.path.join(s5, name)), "sha256": cf.file_digest(os.path.join(s5, name))}
    with open(os.path.join(s5, "COMPLETE")) as f:
        assert json.load(f)["meta_sha256"] == cf.file_digest(os.path.join(s5, "meta.json"))
    assert not [n for n in os.listdir(s5) if n.startswith(".")]   # the ranks' records are gathered, then removed
    assert cf.verdict(s5) == "" and cf.resolve(d).path == s5


@pytest.mark.parametrize("damage, why", [
    ("meta_step", r"meta.json was changed after the save"),
    ("meta_P", r"meta.json was changed after the save"),
    ("weights", r"rank_0.safetensors: content differs from the SHA-256 meta.json records"),
    ("deleted", r"rank_1.safetensors is missing although COMPLETE is there"),
    ("truncated", r"rank_1.safetensors: corrupt checkpoint file \(truncated"),
])
def test_damaged_newest_step_is_passed_over_by_resume_and_listed_alike(two_steps, damage, why):
    d, s5 = two_steps
    if damage == "meta_step":
        _edit_meta(s5, step=3)   # the probe: 10 -> 8 resumed "at step 8" and trained wrongly
    elif damage == "meta_P":
        _edit_meta(s5, P=4)
    elif damage == "weights":
        _overwrite_weights(os.path.join(s5, "rank_0.safetensors"))
    elif damage == "deleted":
        os.remove(os.path.join(s5, "rank_1.safetensors"))
    else:
        f = os.path.join(s5, "rank_1.safetensors")
        os.chmod(f, 0o600)
        os.truncate(f, os.path.getsize(f) - 100)
    src = cf.resolve(d)   # --resume: the next older good step
    assert src.path == os.path.join(d, "step_3") and src.step == 3 and src.ignored == [s5]
    assert re.search(why, src.why[s5]), src.why[s5]
    with pytest.raises(cf.CheckpointError, match=why):   # --resume-from the step: refused naming the file
        cf.resolve(s5)
    p = _ckpt_cli(d)   # the same verdict
    assert p.returncode == 0, p.stderr
    line = [x for x in p.stdout.splitlines() if x.startswith("step_5")][0]
    assert line.startswith("step_5: incomplete (ignored by --resume): ") and re.search(why, line), line
    assert p.stdout.splitlines()[-1] == "--resume would use step_3"


def test_no_digest_skips_only_the_sha256_and_says_so(two_steps, tmp_path):
    d, s5 = two_steps
    _overwrite_weights(os.path.join(s5, "rank_0.safetensors"))
    assert cf.resolve(d, digests=False).path == s5   # same size, valid header: only the digest tells
    p = _ckpt_cli(d, "--no-digest")
    assert p.stdout.splitlines()[0] == "not checking the files' SHA-256 (--no-digest): sizes and headers only"
    assert "step_5: complete, " in p.stdout and "sizes checked (--no-digest)" in p.stdout
    f = os.path.join(d, "step_3", "rank_1.safetensors")
    os.chmod(f, 0o600)
    os.truncate(f, 50)
    assert "step_3: incomplete" in _ckpt_cli(d, "--no-digest").stdout   # sizes and headers still checked


def test_train_refuses_a_damaged_step_before_launch(two_steps, tmp_path):
    d, s5 = two_steps
    _overwrite_weights(os.path.join(s5, "rank_0.safetensors"))
    run = tmp_path / "run"
    p = train("--resume-from", s5, "--run-dir", str(run))
    assert p.returncode == 2 and p.stderr.startswith("error: --resume-from: ") and len(p.stderr.splitlines()) == 1
    assert "rank_0.safetensors: content differs from the SHA-256 meta.json records" in p.stderr, p.stderr
    assert not (run / "logs").exists()   # nothing launched


def test_train_refuses_unwritable_output_dirs_before_launch(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    for flag in ("--save-dir", "--run-dir"):
        p = train(flag, str(blocker / "sub"), "--steps", "1")
        assert p.returncode == 2 and p.stderr.startswith(f"error: {flag}: ") and "is a file" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr


# -- every file of a step covered by its digests (issue 41) -------------------------------------------

def test_every_file_of_a_step_is_covered_and_an_uncovered_or_changed_one_named(two_steps):
    """Saver records every file it writes into a step (config.json too, via ``extra_files``); a file
    written into the step afterwards, or a recorded one changed, is named by the one verdict."""
    d, _ = two_steps
    from hyperparallel.runtime.checkpoint import recipe_hash
    recipe, plan, ranks = _ranks()
    meta = {"recipe_hash": recipe_hash(recipe.raw), "schedule": "transpose"}
    savers = [rt.saver(d, "safetensors", meta) for *_, rt in ranks]
    savers[0].extra_files = {"config.json": '{"architectures": ["X"]}'}   # what a Hugging Face model adds
    for phase in ("begin", "write", "finish"):
        for s in savers:
            getattr(s, phase)(7)
    s7 = cf.step_dir(d, 7)
    m = cf.read_meta(s7)
    assert m["format_version"] == 2 and m["files"] == ["rank_0.safetensors", "rank_1.safetensors"]
    assert sorted(m["digests"]) == ["config.json", "rank_0.safetensors", "rank_1.safetensors"] == cf.step_contents(s7)
    assert m["digests"]["config.json"]["sha256"] == cf.file_digest(os.path.join(s7, "config.json"))
    assert cf.verdict(s7) == ""
    with open(os.path.join(s7, "config.json"), "w") as f:   # rewritten, same size: only the digest tells
        f.write('{"architectures": ["Y"]}')
    assert re.search(r"step_7/config.json: content differs from the SHA-256 meta.json records", cf.verdict(s7))
    assert cf.verdict(s7, digests=False) == ""   # --no-digest: sizes only
    with open(os.path.join(s7, "config.json"), "w") as f:
        f.write('{"architectures": ["X"]}')
    assert cf.verdict(s7) == ""
    os.makedirs(os.path.join(s7, "hf"))
    with open(os.path.join(s7, "hf", "model.safetensors"), "wb") as f:   # e.g. an export into the step
        f.write(b"x")
    why = cf.verdict(s7, digests=False)
    assert why.endswith("step_7/hf/model.safetensors is not covered by the digests meta.json records "
                        "(written into the step after the save)"), why
    src = cf.resolve(d)   # --resume: the newest step whose every file is covered
    assert src.path == os.path.join(d, "step_5") and re.search("hf/model.safetensors is not covered", src.why[s7])
    p = _ckpt_cli(d)
    assert "step_7: incomplete (ignored by --resume): " in p.stdout and "hf/model.safetensors is not covered" in p.stdout
    os.remove(os.path.join(s7, "config.json"))
    shutil.rmtree(os.path.join(s7, "hf"))
    assert cf.verdict(s7).endswith("step_7/config.json is missing although COMPLETE is there (removed after the save)")


def test_a_format_1_step_keeps_its_unrecorded_config_json(two_steps):
    """Checkpoints written before every file was covered (format_version 1) recorded only the weight files;
    their config.json is accepted unverified, any other unrecorded file is named."""
    d, s5 = two_steps
    m = cf.read_meta(s5)
    m["format_version"] = 1
    for name in ("config.json", "notes.txt"):
        with open(os.path.join(s5, name), "w") as f:
            f.write("{}")
    m["digests"] = {n: m["digests"][n] for n in m["files"]}   # what format 1 recorded
    cf.write_json(os.path.join(s5, "meta.json"), m)
    cf.write_json(os.path.join(s5, "COMPLETE"), {"step": 5, "files": m["files"],
                                                 "meta_sha256": cf.file_digest(os.path.join(s5, "meta.json"))})
    assert re.search(r"step_5/notes.txt is not covered by the digests", cf.verdict(s5))
    os.remove(os.path.join(s5, "notes.txt"))
    assert cf.verdict(s5) == ""


# -- ckpt --merge / --export-hf never overwrite what a user has (issue 41) ------------------------------

def _tree_digest(path):
    return {os.path.relpath(os.path.join(r, n), path): cf.file_digest(os.path.join(r, n))
            for r, _, files in os.walk(path) for n in files}


def _refused(p, flag, *parts):
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.startswith(f"error: {flag}: ") and len(p.stderr.splitlines()) == 1, p.stderr
    for part in parts:
        assert part in p.stderr, p.stderr


@pytest.mark.slow
def test_merge_refuses_the_checkpoint_itself_and_existing_files(saved, tmp_path):
    """``--merge OUT`` onto a step's own file (the newest checkpoint destroyed: ``--resume`` would go back a
    step without a word) is refused even with --force; inside the save directory or over an existing file
    only with --force; a missing folder or a folder given as OUT before anything is read."""
    save_dir, _, _ = saved
    d = str(tmp_path / "ck")
    shutil.copytree(save_dir, d)
    before = _tree_digest(d)
    s3 = os.path.join(d, "step_3")
    for out in (os.path.join(s3, "rank_0.safetensors"), os.path.join(s3, "merged.safetensors")):
        for force in ((), ("--force",)):
            _refused(_ckpt_cli(d, "--merge", out, *force), "--merge", out,
                     f"is inside the checkpoint step directory {s3}", "not even --force")
    inside = os.path.join(d, "merged.safetensors")
    _refused(_ckpt_cli(d, "--merge", inside), "--merge", inside, f"inside the save directory {d}", "--force")
    user = tmp_path / "mine.safetensors"
    user.write_bytes(b"the user's own file")
    _refused(_ckpt_cli(d, "--merge", str(user)), "--merge", f"{user} exists", "--force")
    _refused(_ckpt_cli(str(tmp_path / "no_such_ckpt"), "--merge", str(user)), "--merge", "exists")   # checked first
    assert user.read_bytes() == b"the user's own file"
    _refused(_ckpt_cli(d, "--merge", str(tmp_path / "nodir" / "m.safetensors")), "--merge", "does not exist")
    (tmp_path / "adir.ckpt").mkdir()
    _refused(_ckpt_cli(d, "--merge", str(tmp_path / "adir.ckpt")), "--merge", "is a directory")
    _refused(_ckpt_cli(d, "--force"), "--force", "only with --merge or --export-hf")
    assert _tree_digest(d) == before and cf.resolve(d).path == s3
    names = {n for f in cf.read_meta(s3)["files"] for n in cf.safetensors_header(os.path.join(s3, f))}
    params = names - set(cf.optimizer_state_names(names))
    for out in (str(user), inside):   # --force: replaced whole, the step untouched
        p = _ckpt_cli(d, "--merge", out, "--force", timeout=300)
        assert p.returncode == 0 and p.stdout.startswith(f"wrote {out}: "), p.stderr
        assert set(cf.safetensors_header(out)) == params
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]   # no temporary file left
    assert {k: v for k, v in _tree_digest(d).items() if k != "merged.safetensors"} == before
    assert cf.resolve(d).path == s3 and cf.verdict(s3) == ""


@pytest.mark.slow
def test_export_hf_refuses_checkpoints_files_and_non_empty_folders(saved, tmp_path):
    """``--export-hf OUT`` into a step (its config.json rewritten), into the save directory itself (it would
    then read as a Hugging Face model: --resume from step 0), onto a file, or into a folder with the
    user's files (save_pretrained's clean-up deleted their shards) is refused before anything is read."""
    save_dir, _, _ = saved
    d = str(tmp_path / "ck")
    shutil.copytree(save_dir, d)
    before = _tree_digest(d)
    s3 = os.path.join(d, "step_3")
    for out in (s3, os.path.join(s3, "hf"), os.path.join(d, "step_9")):
        for force in ((), ("--force",)):
            _refused(_ckpt_cli(d, "--export-hf", out, *force), "--export-hf", out, "inside the checkpoint step directory")
    for force in ((), ("--force",)):
        _refused(_ckpt_cli(d, "--export-hf", d, *force), "--export-hf", "is the save directory itself")
    _refused(_ckpt_cli(d, "--export-hf", os.path.join(d, "hf")), "--export-hf", f"inside the save directory {d}")
    f = tmp_path / "a_file"
    f.write_text("x")
    _refused(_ckpt_cli(d, "--export-hf", str(f)), "--export-hf", "is a file")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "model-00001-of-00002.safetensors").write_bytes(b"shard")
    (mine / "config.json").write_text("{}")
    _refused(_ckpt_cli(d, "--export-hf", str(mine)), "--export-hf", f"{mine} is not empty (2 entries: config.json, "
             "model-00001-of-00002.safetensors)", "--force")
    assert sorted(os.listdir(mine)) == ["config.json", "model-00001-of-00002.safetensors"]
    assert (mine / "config.json").read_text() == "{}" and _tree_digest(d) == before
    assert not os.path.exists(os.path.join(d, "hf")) and not os.path.exists(os.path.join(d, "step_9"))


QWEN = os.path.join(ROOT, "recipes", "qwen2_5_vl_tiny.yaml")


@pytest.fixture(scope="module")
def qwen_step(tmp_path_factory):
    """A step directory of the tiny Qwen2.5-VL without a job: the whole model's parameters in one rank file
    and its config.json (what the ranks' Saver writes for it), sealed as the Saver seals a step."""
    pytest.importorskip("mindone", reason="mindone is not installed")
    import mindspore as ms
    from hyperparallel.runtime import compat
    from hyperparallel.models import adapter_for
    compat.setup_device("CPU")
    adapter = adapter_for(load_recipe(QWEN).raw["model"], {}, 0)
    net = adapter.network()
    d = cf.step_dir(str(tmp_path_factory.mktemp("qck")), 1)
    os.makedirs(d)
    rank0 = os.path.join(d, "rank_0.safetensors")
    ms.save_checkpoint(net, rank0, format="safetensors")
    for name, text in adapter.checkpoint_files().items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    cf.seal_step(d, {"format_version": cf.FORMAT_VERSION, "format": "safetensors", "step": 1,
                     "files": ["rank_0.safetensors"]}, {"rank_0.safetensors": cf.file_record(rank0)})
    assert cf.verdict(d) == "" and "config.json" in cf.read_meta(d)["digests"]
    return d, {p.name: p.asnumpy() for p in net.get_parameters()}


@pytest.mark.slow
def test_export_hf_force_replaces_the_previous_model_and_keeps_the_other_files(qwen_step, tmp_path):
    """``--export-hf OUT --force`` into a folder holding a previous, sharded export and the user's own
    files: the previous config.json, index and shards are replaced (none left that a loader would read
    before the new model.safetensors), the other files kept, no temporary folder left; the new
    weights are the step's."""
    import mindspore as ms
    import numpy as np
    from hyperparallel.models import hf_dir
    step, values = qwen_step
    before = _tree_digest(step)
    out = tmp_path / "hf"
    out.mkdir()
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shards[0], "b": shards[1]}}))
    for s in shards:
        (out / s).write_bytes(b"an older export's shard")
    (out / "config.json").write_text('{"architectures": ["Older"]}')
    (out / "notes.txt").write_text("the user's notes")
    _refused(_ckpt_cli(step, "--export-hf", str(out)), "--export-hf", "is not empty (5 entries", "--force")
    assert (out / shards[0]).exists()
    p = _ckpt_cli(step, "--export-hf", str(out), "--force", timeout=600)
    assert p.returncode == 0 and p.stdout.splitlines()[-1].startswith(f"wrote {out}: {len(values)} tensors from {step}"), \
        p.stderr[-2000:]
    assert "processor files not written: the step's meta.json records no tokenizer" in p.stdout   # said, not a silent gap
    left = set(os.listdir(out))
    assert {"config.json", "model.safetensors", "notes.txt"} <= left and not left & set(shards)
    assert "model.safetensors.index.json" not in left and (out / "notes.txt").read_text() == "the user's notes"
    assert hf_dir.weight_files(str(out)) == [str(out / "model.safetensors")]   # what the project's loader reads
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "qwen2_5_vl" and "architectures" not in cfg   # save_pretrained's, not the older one
    got = ms.load_checkpoint(str(out / "model.safetensors"), format="safetensors")
    assert len(got) == len(values) and "lm_head.weight" in got and any(n.startswith("visual.") for n in got)
    for hub, v in got.items():   # the hub's spelling of the step's names, the step's values
        np.testing.assert_array_equal(v.asnumpy(), values["model." + hub if hub.startswith("visual.") else
                                                           "model.language_model." + hub[6:] if hub.startswith("model.")
                                                           else hub])
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]   # the export's temporary folder removed
    assert _tree_digest(step) == before and cf.verdict(step) == ""


def _auto_processor():
    """transformers' AutoProcessor where torchvision is installed (its video processor needs it), else
    mindone's (the same files, read by mindone.transformers' classes)."""
    try:
        import torchvision  # noqa: F401
        from transformers import AutoProcessor
    except ImportError:
        from mindone.transformers import AutoProcessor
    return AutoProcessor


@pytest.mark.slow
def test_export_hf_writes_the_recipes_processor_that_lays_a_conversation_out_as_training_did(qwen_step, tmp_path,
                                                                                        monkeypatch):
    """A step whose meta.json records the run's processor (what the Saver records for a conversations
    recipe) exports a directory ``AutoProcessor.from_pretrained`` loads: its chat template and tokenizer
    give a conversation with an image the ids the data layer trains on (image pads expanded), and its
    image processor the same pixels and grid."""
    import numpy as np
    from PIL import Image
    from hyperparallel.data.demo import write_demo
    from hyperparallel.data.conversations_config import ConversationsConfig
    from hyperparallel.data.formats import resolve_format
    from hyperparallel.models.qwen_vl.layout import QwenLayout
    from hyperparallel.data.pixels import decode_eager
    from hyperparallel.data.text import Tok
    from hyperparallel.models import adapter_for
    from hyperparallel.models.qwen_vl.processor import processor_record
    step0, _ = qwen_step
    demo = write_demo(str(tmp_path / "demo"), 8, seed=1)
    raw = load_recipe(QWEN).raw
    data = dict(raw["data"], path=demo["path"], image_root=demo["image_root"], tokenizer=demo["tokenizer"],
                system_prompt="You look at pictures.")
    step = str(tmp_path / "ck" / "step_1")
    shutil.copytree(step0, step)
    meta = cf.read_meta(step)
    digests = meta.pop("digests")
    cf.seal_step(step, dict(meta, processor=processor_record(ConversationsConfig.from_section(data, 1))),
                 {"rank_0.safetensors": digests["rank_0.safetensors"]})
    out = tmp_path / "hf"
    p = _ckpt_cli(step, "--export-hf", str(out), timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert f"(tokenizer {demo['tokenizer']})" in p.stdout and "processor: wrote" in p.stdout
    assert {"tokenizer.json", "tokenizer_config.json", "preprocessor_config.json", "config.json",
            "model.safetensors"} <= set(os.listdir(out))
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    monkeypatch.setattr(sys, "path", list(sys.path))   # mindone's auto classes add to sys.path (hf_processor)
    proc = _auto_processor().from_pretrained(str(out))

    cfg = ConversationsConfig.from_section(data, 1)
    fmt = resolve_format(adapter_for(raw["model"], {}, 0).data_format)
    layout = QwenLayout(cfg, fmt, Tok(demo["tokenizer"]))
    with open(demo["path"]) as f:
        rec = next(r for r in map(json.loads, f) if r.get("image"))
    sample = layout.parse("s", rec)
    messages = []
    for turn in rec["conversations"]:
        parts = []
        for k, piece in enumerate(turn["value"].split("<image>")):
            parts += ([{"type": "image"}] if k else []) + ([{"type": "text", "text": piece}] if piece else [])
        messages.append({"role": {"human": "user", "gpt": "assistant", "system": "system"}[turn["from"]],
                         "content": parts})
    text = proc.apply_chat_template(messages, tokenize=False)
    with Image.open(sample.files[0]) as im:
        got = proc(text=[text], images=[im.convert("RGB")], return_tensors="np")
    np.testing.assert_array_equal(np.asarray(got["input_ids"][0]), sample.enc.ids)
    pixels, grid = decode_eager(sample.files[0], [layout.pixels()])
    np.testing.assert_array_equal(np.asarray(got["image_grid_thw"][0]), grid)
    np.testing.assert_allclose(np.asarray(got["pixel_values"]), pixels, rtol=0, atol=1e-6)


def test_processor_record_is_what_the_data_layer_uses(tmp_path):
    """meta.json's ``processor``: the tokenizer file (absolute), the image settings in effect (a recipe key
    over its preprocessor_config.json over Qwen's defaults) and system_prompt; None for synthetic data."""
    from hyperparallel.data import data_config
    from hyperparallel.data.conversations_config import ConversationsConfig
    from hyperparallel.models.qwen_vl.processor import processor_record
    from hyperparallel.data.demo import write_demo
    demo = write_demo(str(tmp_path / "demo"), 4, seed=1)
    pre = tmp_path / "preprocessor_config.json"
    pre.write_text(json.dumps({"min_pixels": 512, "max_pixels": 4096, "image_mean": [0.5, 0.5, 0.5]}))
    data = {"type": "conversations", "path": demo["path"], "tokenizer": os.path.relpath(demo["tokenizer"]),
            "preprocessor_config": str(pre), "max_pixels": 2048, "system_prompt": "Be brief."}
    rec = processor_record(ConversationsConfig.from_section(data, 1))
    assert rec == {"tokenizer": demo["tokenizer"], "min_pixels": 512, "max_pixels": 2048,
                   "image_mean": [0.5, 0.5, 0.5], "image_std": rec["image_std"], "system_prompt": "Be brief.",
                   "fps": 2.0, "min_frames": 4, "max_frames": 768}   # Qwen's video defaults
    assert processor_record(data_config(load_recipe(RECIPE).raw)) is None   # synthetic
    assert processor_record(None) is None


def test_processor_files_not_written_say_why(tmp_path):
    """No record (an older step), a model without a processor writer, a tokenizer gone since the run: nothing
    written, and the reason the export prints."""
    from hyperparallel.models.qwen_vl.processor import write_processor
    qwen = {"architectures": ["Qwen2_5_VLForConditionalGeneration"]}
    rec = {"tokenizer": str(tmp_path / "gone.json"), "min_pixels": 256, "max_pixels": 1024,
           "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "system_prompt": None}
    assert write_processor(None, qwen, str(tmp_path)) == ([], "the step's meta.json records no tokenizer (saved by "
                                                              "an older hyperparallel, or its recipe's data names none)")
    names, why = write_processor(rec, {"architectures": ["LlamaForCausalLM"]}, str(tmp_path))
    assert names == [] and why == "no processor is written for LlamaForCausalLM (only Qwen2_5_VLForConditionalGeneration)"
    assert write_processor(rec, qwen, str(tmp_path)) == ([], f"the run's tokenizer {rec['tokenizer']} is not there any more")
    assert os.listdir(tmp_path) == []
