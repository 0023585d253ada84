"""LLaVA-style conversations with image files: index, sequence rule, order, resume, bad input,
and (one msrun launch) 2-rank training equal to the single-process reference.

Data sets are written into temp dirs by ``tools/make_demo_data.py``, a clean one and one with a bad sample
of each kind interleaved.
"""
import json
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from hyperparallel.data import data_config
from hyperparallel.data.conversations import ConversationsSource, build_index
from hyperparallel.data.demo import BROKEN_KINDS, write_demo
from hyperparallel.data.text import Tok
from hyperparallel.recipe import load_recipe

from helpers import ROOT, run_main
from helpers import assert_equivalent, dumped, job_case, launch_cases

RECIPE = os.path.join(ROOT, "recipes", "tiny_mllm_data.yaml")
N_SAMPLES = 48
STEPS = 3


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return write_demo(str(tmp_path_factory.mktemp("clean")), N_SAMPLES, seed=1)


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    return write_demo(str(tmp_path_factory.mktemp("broken")), N_SAMPLES, seed=1, broken=True)


def _sets(paths, extra=()):
    return [f"data.{k}={v}" for k, v in paths.items()] + list(extra)


def _raw(paths, extra=()):
    return load_recipe(RECIPE, overrides=_sets(paths, extra)).raw


def _source(paths, extra=(), tokens_per_image=1, seed=0):
    return ConversationsSource(data_config(_raw(paths, extra)), tokens_per_image, seed)


def _cli_sets(paths, extra=()):
    out = []
    for s in _sets(paths, extra):
        out += ["--set", s]
    return out


# -- index and bad input ---------------------------------------------------------------------

def test_index_names_every_bad_sample_with_file_and_line(broken):
    cfg = data_config(_raw(broken, ["data.on_bad_sample=skip"]))
    samples, problems = build_index(cfg, 1)
    assert len(samples) == N_SAMPLES
    assert sorted(p.kind for p in problems) == sorted(BROKEN_KINDS)
    lines = [int(re.search(r"train\.jsonl:(\d+)", p.where).group(1)) for p in problems]
    assert lines == [3 + 7 * j for j in range(len(BROKEN_KINDS))]   # where write_demo put them
    msgs = {p.kind: str(p) for p in problems}
    assert "no_such_file.png" in msgs["missing_image"] and "broken.png" in msgs["unreadable_image"]
    assert "> data.seq_len 40" in msgs["too_long"]


def test_error_policy_stops_at_the_first_bad_sample(broken):
    with pytest.raises(ValueError, match=r"^data: 6 bad sample\(s\) in .*train\.jsonl.*first: .*train\.jsonl:3 "
                                         r"\(id bad_missing\): missing_image"):
        _source(broken)
    src = _source(broken, ["data.on_bad_sample=skip"])
    assert src.skipped == 6 and len(src.samples) == N_SAMPLES


def test_data_check_cli_reports_every_problem_with_counts(clean, broken):
    r = run_main("data", "check", RECIPE, *_cli_sets(broken))
    assert r.returncode == 1, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 6 and all("train.jsonl:" in e for e in errors)
    assert "problems by kind: malformed_json 1, missing_image 1, placeholder_mismatch 2, too_long 1, " \
           "unreadable_image 1" in r.stderr
    assert f"{N_SAMPLES + 6} samples, {N_SAMPLES} usable, 6 with problems" in r.stdout
    r = run_main("data", "check", RECIPE, *_cli_sets(clean))
    assert r.returncode == 0 and f"{N_SAMPLES} usable, 0 with problems" in r.stdout, r.stderr
    r = run_main("data", "check", os.path.join(ROOT, "recipes", "nope.yaml"))
    assert r.returncode == 2 and "error: recipe: file not found" in r.stderr
    r = run_main("data", "check", RECIPE, *_cli_sets(clean, ["data.on_bad_sample=maybe"]))
    assert r.returncode == 2 and "error: data.on_bad_sample: 'maybe' unknown (error, skip)" in r.stderr


def test_json_list_files_name_the_sample_index(tmp_path, clean):
    recs = _records(clean)[:6]
    recs[4]["conversations"][0]["value"] += " <image>"       # one placeholder too many
    p = tmp_path / "list.json"
    p.write_text(json.dumps(recs))
    paths = dict(clean, path=str(p))
    cfg = data_config(_raw(paths))
    samples, problems = build_index(cfg, 1)
    assert len(samples) == 5 and [(pr.where, pr.kind) for pr in problems] == \
        [(f"{p} sample 4 (id {recs[4]['id']})", "placeholder_mismatch")]
    p.write_text(json.dumps(recs)[:-30])                    # the whole list is unusable
    r = run_main("data", "check", RECIPE, *_cli_sets(paths))
    assert r.returncode == 1 and re.search(rf"error: data.path: {re.escape(str(p))}:1: malformed JSON", r.stderr)


def test_image_that_passes_the_header_but_fails_to_decode_is_found_by_check(tmp_path, clean):
    d = str(tmp_path)
    paths = write_demo(d, 12, seed=2)
    recs = [json.loads(ln) for ln in open(paths["path"])]
    i = next(i for i, r in enumerate(recs) if isinstance(r.get("image"), str))
    img = os.path.join(d, recs[i]["image"])
    data = open(img, "rb").read()
    with open(img, "wb") as f:
        f.write(data[:len(data) // 2])   # truncated PNG
    r = run_main("data", "check", RECIPE, *_cli_sets(paths))
    assert r.returncode == 1
    assert re.search(rf"train\.jsonl:{i + 1} .*(unreadable_image|undecodable_image).*{os.path.basename(img)}",
                     r.stderr), r.stderr


def test_image_that_breaks_after_the_index_stops_the_run_naming_it(tmp_path):
    paths = write_demo(str(tmp_path), 12, seed=2)
    src = _source(paths, ["data.shuffle=false", "data.on_bad_sample=skip"])
    src.will_read_pixels(range(src.cfg.micro_per_step))
    victim = src.batch_samples(1, 2)[0].files or src.batch_samples(1, 2)[1].files
    with open(victim[0], "wb") as f:
        f.write(b"garbage")                 # after every rank built its index
    with pytest.raises(RuntimeError, match=rf"^data: cannot decode image {re.escape(victim[0])}: .*Decode"):
        for step in range(2):
            for g in range(src.cfg.micro_per_step):
                src.micro_batch(step, g).patches
    src.close()


def test_train_scans_the_data_before_launch(broken):
    r = run_main("train", RECIPE, *_cli_sets(broken))
    assert r.returncode == 2
    assert re.search(r"error: data: 6 bad sample\(s\) in .*train\.jsonl \(malformed_json 1, .*\); first: "
                     r".*train\.jsonl:3 \(id bad_missing\): missing_image: image file not found", r.stderr), r.stderr
    assert "hyperparallel data check" in r.stderr and "data.on_bad_sample=skip" in r.stderr
    hint = "hyperparallel data check " + RECIPE + "".join(f" --set {shlex.quote(s)}" for s in _cli_sets(broken)[1::2])
    assert hint in r.stderr, r.stderr   # the hint repeats the user's --set flags: it runs as printed
    assert "msrun" not in r.stdout   # nothing launched


def test_tokenizer_that_does_not_load_names_the_file(tmp_path, clean):
    bad = tmp_path / "tok.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(ValueError, match=rf"^data.tokenizer: cannot load {re.escape(str(bad))} as a Hugging Face"):
        data_config(_raw(dict(clean, tokenizer=str(bad))))
    r = run_main("data", "check", RECIPE, *_cli_sets(dict(clean, tokenizer=str(bad))))
    assert r.returncode == 2 and f"error: data.tokenizer: cannot load {bad}" in r.stderr


def test_vocabulary_must_fit_the_tokenizer(clean):
    size = Tok(clean["tokenizer"]).vocab_size
    with pytest.raises(ValueError, match=rf"^data.vocab: 10 is smaller than the vocabulary of the tokenizer "
                                         rf".*\({size} tokens\)"):
        data_config(_raw(clean, ["data.vocab=10"]))
    assert data_config(_raw(clean)).shapes()["vocab"] == size
    assert data_config(_raw(clean, [f"data.vocab={size + 5}"])).shapes()["vocab"] == size + 5


def test_missing_demo_set_tells_how_to_make_it(tmp_path):
    with pytest.raises(ValueError, match=r"^data.path: file not found: .*python tools/make_demo_data.py"):
        data_config(_raw({"path": str(tmp_path / "none.jsonl")}))
    r = run_main("train", RECIPE, "--set", f"data.path={tmp_path / 'none.jsonl'}")
    assert r.returncode == 2 and "error: data.path: file not found:" in r.stderr
    assert "python tools/make_demo_data.py data/demo" in r.stderr
    with pytest.raises(ValueError, match=r"^data.type: 'nope' unknown \(known: synthetic, conversations\)"):
        data_config({"data": {"type": "nope"}})


# -- data stays inside its root, in bounded memory ------------------------------------------------

def _sample(image, sid="s"):
    return json.dumps({"id": sid, "image": image, "conversations": [
        {"from": "human", "value": "<image>\nwhat is this ?"}, {"from": "gpt", "value": "this is beta ."}]})


def test_image_names_that_leave_the_image_root_are_refused_alike_whether_the_file_exists(tmp_path, clean):
    from PIL import Image
    root, out = tmp_path / "root", tmp_path / "outside"
    (root / "images").mkdir(parents=True)
    out.mkdir()
    Image.new("RGB", (16, 16), (9, 99, 9)).save(root / "images" / "a.png")
    Image.new("RGB", (16, 16), (1, 2, 3)).save(out / "secret.png")
    (root / "images" / "link.png").symlink_to(out / "secret.png")
    (root / "images" / "dangling.png").symlink_to(out / "none.png")
    (root / "images" / "in.png").symlink_to(root / "images" / "a.png")   # a link inside the root is fine
    names = [str(out / "secret.png"), str(out / "none.png"), "../outside/secret.png", "../outside/none.png",
             "images/../../outside/secret.png", "images/link.png", "images/dangling.png"]
    p = tmp_path / "train.jsonl"
    p.write_text("\n".join([_sample("images/a.png", "ok"), _sample("images/in.png", "in")]
                           + [_sample(n, f"out{i}") for i, n in enumerate(names)]) + "\n")
    paths = dict(clean, path=str(p), image_root=str(root))
    samples, problems = build_index(data_config(_raw(paths, ["data.on_bad_sample=skip"])), 1)
    assert [s.id for s in samples] == ["ok", "in"]
    assert [(pr.where, pr.kind) for pr in problems] == \
        [(f"{p}:{3 + i} (id out{i})", "outside_image_root") for i in range(len(names))]
    for pr, name in zip(problems, names):   # one message whether the outside file exists or not
        assert pr.message == (f"image {name!r} resolves outside data.image_root {root} (an absolute path "
                              "elsewhere, '..' or a symlink out); not read (data.allow_outside_root: true reads "
                              "such files)")
    samples, problems = build_index(data_config(_raw(paths, ["data.on_bad_sample=skip",
                                                             "data.allow_outside_root=true"])), 1)
    assert [s.id for s in samples] == ["ok", "in", "out0", "out2", "out4", "out5"]   # opted in: read
    assert {pr.kind for pr in problems} == {"missing_image"}
    with pytest.raises(ValueError, match=r"^data.allow_outside_root: true or false, got 'maybe'"):
        data_config(_raw(paths, ["data.allow_outside_root=maybe"]))
    r = run_main("train", RECIPE, *_cli_sets(paths))   # refused before launch, naming line and root
    assert r.returncode == 2 and "msrun" not in r.stdout, r.stderr
    assert f"first: {p}:3 (id out0): outside_image_root: image '{out / 'secret.png'}' resolves outside " \
           f"data.image_root {root}" in r.stderr, r.stderr


def test_a_huge_jsonl_line_is_refused_unparsed_in_bounded_memory(tmp_path, clean):
    import tracemalloc
    good = _records(clean)[:2]
    big = json.dumps({"id": "big", "conversations": good[0]["conversations"], "pad": "x" * (20 << 20)})
    p = tmp_path / "train.jsonl"
    p.write_text("\n".join([json.dumps(good[0]), big, json.dumps(good[1])]) + "\n")
    cfg = data_config(_raw(dict(clean, path=str(p)), ["data.on_bad_sample=skip"]))
    limit = 64 * cfg.seq_len + (1 << 20)   # the default cap
    tracemalloc.start()
    try:
        samples, problems = build_index(cfg, 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak          # the 20 MiB line is never held whole (nor decoded, parsed, tokenized)
    assert [s.id for s in samples] == [good[0]["id"], good[1]["id"]]   # the lines around it are read
    assert [str(pr) for pr in problems] == [
        f"{p}:2: line_too_long: line of {len(big) + 1:,} bytes is longer than {limit:,} bytes, the cap "
        "data.max_line_bytes sets (default: 64 x data.seq_len + 1 MiB); not parsed"]
    cfg = data_config(_raw(dict(clean, path=str(p)), ["data.on_bad_sample=skip", "data.max_line_bytes=1000"]))
    assert [pr.where for pr in build_index(cfg, 1)[1]] == [f"{p}:2"]
    lst = tmp_path / "list.json"   # a .json list: the sample written back as JSON is measured
    lst.write_text(json.dumps([good[0], {"id": "long", "conversations": good[0]["conversations"],
                                         "pad": "x" * 2000}]))
    cfg = data_config(_raw(dict(clean, path=str(lst)), ["data.on_bad_sample=skip", "data.max_line_bytes=1000"]))
    samples, problems = build_index(cfg, 1)
    assert len(samples) == 1 and [(pr.where, pr.kind) for pr in problems] == [(f"{lst} sample 1", "line_too_long")]
    assert "sample (as JSON) of 2," in problems[0].message
    with pytest.raises(ValueError, match=r"^data.max_line_bytes: an integer >= 1 \(or null: 64 x data.seq_len"):
        data_config(_raw(clean, ["data.max_line_bytes=0"]))


def test_tokenizer_ids_with_gaps_size_the_vocabulary_by_the_largest_id(tmp_path, clean):
    d = json.load(open(clean["tokenizer"]))
    vocab = d["model"]["vocab"]
    word = "beta"   # a class name the answers say
    assert max(vocab.values()) < 100
    vocab[word] = 500   # a gap: ids below 100, then 500
    tok = tmp_path / "gap.json"
    tok.write_text(json.dumps(d))
    assert Tok(str(tok)).vocab_size == 501
    recs = [r for r in _records(clean) if any(word in t["value"].split() for t in r["conversations"]
                                              if t["from"] == "gpt")][:2]
    assert len(recs) == 2
    p = tmp_path / "train.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    paths = dict(clean, path=str(p), tokenizer=str(tok))
    assert data_config(_raw(paths)).shapes()["vocab"] == 501
    mb = _source(paths, ["data.seq_len=64"]).micro_batch(0, 0)   # rank 0 indexed the one-hot targets: IndexError
    assert mb.onehot.shape[-1] == 501 and mb.onehot[..., 500].sum() >= 2
    with pytest.raises(ValueError, match=r"^data.vocab: 100 is smaller than the vocabulary of the tokenizer "
                                         r".*\(501 tokens\)"):
        data_config(_raw(paths, ["data.vocab=100"]))


@pytest.mark.slow
def test_data_check_on_an_animated_gif_writes_nothing_into_the_working_folder(tmp_path, clean):
    from PIL import Image
    root = tmp_path / "root"
    root.mkdir()
    frames = [Image.new("RGB", (16, 16), (60 * i, 0, 0)) for i in range(3)]
    frames[0].save(root / "anim.gif", save_all=True, append_images=frames[1:], duration=100, loop=0)
    Image.new("RGB", (16, 16), (1, 2, 3)).save(root / "a.png")
    p = tmp_path / "train.jsonl"
    p.write_text(_sample("anim.gif", "gif") + "\n" + _sample("a.png", "png") + "\n")
    work = tmp_path / "work"
    work.mkdir()
    sets = _cli_sets(dict(clean, path=str(p), image_root=str(root)))
    r = subprocess.run([sys.executable, "-m", "hyperparallel", "data", "check", RECIPE, *sets], cwd=work,
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert os.listdir(work) == [], os.listdir(work)   # vision.Decode never saw the GIF (it dumps it here)
    assert r.returncode == 1, r.stderr
    assert f"error: {p}:1 (id gif): unsupported_image: {root / 'anim.gif'} is a GIF image; " \
           "mindspore.dataset.vision.Decode of this layout reads JPEG, MPO, PNG, BMP, TIFF, PPM" in r.stderr, r.stderr
    assert "problems by kind: unsupported_image 1 (data.on_bad_sample: skip leaves these 1 out" in r.stderr


# -- sequence rule ---------------------------------------------------------------------------

def _records(paths):
    return [json.loads(ln) for ln in open(paths["path"])]


def test_loss_only_on_answer_tokens_and_padding_rule(clean):
    src = _source(clean, ["data.shuffle=false"])
    tok = Tok(clean["tokenizer"])
    recs = {r["id"]: r for r in _records(clean)}
    S = src.cfg.seq_len
    seen_video = seen_text_only = False
    for step in range(3):
        for g in range(src.cfg.micro_per_step):
            mb = src.micro_batch(step, g)
            merge = mb.merge_index.reshape(-1, S)
            for b, sid in enumerate(mb.sample_ids):
                rec = recs[sid]
                want = []
                for t in rec["conversations"]:
                    if t["from"] == "gpt":
                        want += tok.encode(" " + t["value"]) + [tok.eos]
                got = [int(np.argmax(mb.onehot[b, t])) for t in range(S) if mb.mask[b, t]]
                assert got == want, sid                      # targets = the answers, nothing else
                assert mb.onehot[b].sum() == mb.mask[b].sum()
                n = mb.images_per_sample[b]
                assert n == len([rec["image"]] if isinstance(rec.get("image"), str) else rec.get("image", [])) \
                    + len(rec.get("video", []))
                L = int((merge[b] > 0).sum())
                assert (merge[b, :L] > 0).all() and (merge[b, L:] == 0).all()   # padded at the end with row 0
                assert not mb.mask[b, L - 1:].any()          # no target past the sequence
                seen_video |= "video" in rec
                seen_text_only |= n == 0
    assert seen_video and seen_text_only


def test_placeholder_expansion_count_comes_from_the_model(clean):
    from hyperparallel.models.base import ModelAdapter
    with pytest.raises(ValueError, match=r"too_long: \d+ tokens \(images expanded to 3 token\(s\) each\)"):
        _source(clean, tokens_per_image=3)   # 6-frame videos no longer fit in 40
    one, three = _source(clean, ["data.seq_len=64"]), _source(clean, ["data.seq_len=64"], tokens_per_image=3)
    for g in range(4):
        a, b = one.micro_batch(0, g), three.micro_batch(0, g)
        S = one.cfg.seq_len
        la, lb = (a.merge_index.reshape(-1, S) > 0).sum(1), (b.merge_index.reshape(-1, S) > 0).sum(1)
        np.testing.assert_array_equal(lb - la, 2 * np.asarray(a.images_per_sample))
        rows = b.merge_index[(b.merge_index > 0) & (b.merge_index <= 3 * b.num_images)]
        assert sorted(rows.tolist()) == list(range(1, 3 * sum(b.images_per_sample) + 1))
    with pytest.raises(NotImplementedError, match="image_tokens"):
        ModelAdapter().image_tokens()


def test_text_only_micro_batch_gets_an_unread_filler_image(tmp_path, clean):
    recs = [r for r in _records(clean) if "image" not in r and "video" not in r][:2]
    p = tmp_path / "text.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    src = _source(dict(clean, path=str(p)))
    mb = src.micro_batch(0, 0)
    assert mb.images_per_sample == [0, 0] and mb.extra_images == 1 and mb.num_images == 1
    assert 1 not in mb.merge_index.tolist()           # row 1 (the filler) is never read
    assert mb.patches.shape == (1, src.cfg.num_patches, src.cfg.patch_dim) and not mb.patches.any()


def _table_refs(mb, S, k):
    """What each sequence position of ``mb`` reads: ("pad",), ("img", row) of a real image, ("fill", row)
    of a filler image, ("txt", token id)."""
    real, rows = sum(mb.images_per_sample) * k, mb.num_images * k
    out = []
    for v in mb.merge_index.tolist():
        if v == 0:
            out.append(("pad",))
        elif v <= rows:
            out.append(("img", v - 1) if v - 1 < real else ("fill", v - 1))
        else:
            out.append(("txt", int(mb.text_ids[v - 1 - rows])))
    return out


def test_shape_buckets_pad_with_unread_fillers_and_bound_the_shapes(clean):
    from hyperparallel.data.conversations_config import bucket
    assert [bucket(n, 8) for n in (0, 1, 2, 3, 5, 8, 9)] == [1, 1, 2, 4, 8, 8, 9]
    assert bucket(5, 6) == 6 and bucket(3, 0) == 3   # capped, never below n
    plain = _source(clean, ["data.seq_len=64", "data.shape_buckets=none"])
    padded = _source(clean, ["data.seq_len=64", "data.shape_buckets=pow2"])
    S, k, B = 64, 1, plain.cfg.micro_batch_size
    shapes = {"none": set(), "pow2": set()}
    for step in range(12):
        for g in range(4):
            a, b = plain.micro_batch(step, g), padded.micro_batch(step, g)
            assert a.sample_ids == b.sample_ids and a.images_per_sample == b.images_per_sample
            for n, cap in ((b.num_images, B * S // k), (len(b.text_ids), B * S)):
                assert n & (n - 1) == 0 or n == cap, (n, cap)   # a power of two, or the cap
            assert b.num_images >= max(1, sum(b.images_per_sample)) and len(b.text_ids) >= len(a.text_ids)
            assert _table_refs(b, S, k) == _table_refs(a, S, k)   # every position reads what it read unpadded
            np.testing.assert_array_equal(b.onehot, a.onehot)
            np.testing.assert_array_equal(b.mask, a.mask)
            real = sum(a.images_per_sample)
            np.testing.assert_array_equal(b.patches[:real], a.patches[:real])
            assert not b.patches[real:].any() and b.patches.shape[0] == b.num_images
            shapes["none"].add((a.num_images, len(a.text_ids)))
            shapes["pow2"].add((b.num_images, len(b.text_ids)))
    assert len(shapes["pow2"]) < len(shapes["none"]) / 2, shapes
    plain.close(), padded.close()
    with pytest.raises(ValueError, match=r"^data.shape_buckets: 'pow3' unknown; allowed: none, pow2$"):
        _source(clean, ["data.shape_buckets=pow3"])
    with pytest.raises(ValueError, match=r"^data.shape_buckets: pow2 with data.balance encoder: .* set one of them to none$"):
        _source(clean, ["data.shape_buckets=pow2", "data.balance=encoder", "train.loss_normalization=tokens"])


def test_cost_replay_counts_the_padded_images(clean):
    """``simulate --data-steps`` replays the encoder work the micro-batches carry: with shape buckets,
    the filler images too."""
    def steps(setting):
        p = run_main("simulate", RECIPE, *_cli_sets(clean, [f"data.shape_buckets={setting}",
                                                           "mpipe.profile.regions.0.fixed_share=0"]),
                     "--data-steps", "8", "--schedule", "transpose", "--json")
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)[0]["step_ms"]
    plain, padded = steps("none"), steps("pow2")
    assert all(b >= a - 1e-9 for a, b in zip(plain, padded)) and sum(padded) > sum(plain) + 1e-6, (plain, padded)


@pytest.mark.slow
def test_shape_buckets_leave_losses_and_gradients_exact(clean):
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    plain_losses, plain_grads, _ = _reference(clean, ["data.shape_buckets=none"])
    losses, grads, _ = _reference(clean, ["data.shape_buckets=pow2"])
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6, atol=0)
    assert sorted(grads) == sorted(plain_grads) and any(n.startswith("vision.") for n in grads)
    for n in grads:
        np.testing.assert_allclose(grads[n], plain_grads[n], rtol=1e-5, atol=1e-7, err_msg=n)


# -- order, position, resume, pixels --------------------------------------------------------------

def test_shuffle_is_a_pure_function_of_seed_and_epoch(clean):
    a, b, c = _source(clean), _source(clean), _source(clean, seed=5)
    for e in range(3):
        np.testing.assert_array_equal(a.order(e), b.order(e))
        assert sorted(a.order(e)) == list(range(N_SAMPLES))
    assert not np.array_equal(a.order(0), a.order(1))
    assert not np.array_equal(a.order(0), c.order(0))
    assert data_config(_raw(clean, ["data.seed=5"])).seed == 5
    assert _source(clean, ["data.seed=5"]).order(0).tolist() == c.order(0).tolist()   # data.seed wins
    # one step reads micro_per_step x micro_batch_size consecutive positions of the epoch order
    per = a.samples_per_step
    ids = [s for g in range(a.cfg.micro_per_step) for s in a.micro_batch(1, g).sample_ids]
    assert ids == [a.samples[int(i)].id for i in a.order(0)[per:2 * per]]


def _same(x, y):
    for f in ("text_ids", "merge_index", "onehot", "mask", "patches"):
        np.testing.assert_array_equal(getattr(x, f), getattr(y, f))
    assert x.images_per_sample == y.images_per_sample and x.sample_ids == y.sample_ids


def test_resume_at_step_k_reads_the_same_micro_batches(clean):
    full = _source(clean)
    k = 5   # step 5 of 8 samples per step over 48 samples: crosses into epoch 1 at step 6
    pos = full.position(k)
    assert pos == {"epoch": 0, "index": 40, "num_samples": N_SAMPLES}
    assert full.position(6) == {"epoch": 1, "index": 0, "num_samples": N_SAMPLES}
    resumed = _source(clean)
    resumed.will_read_pixels(range(resumed.cfg.micro_per_step))
    resumed.micro_batch(0, 0).patches                    # its pipeline already reads ahead from step 0
    resumed.seek(json.loads(json.dumps(pos)), k)        # as stored in a checkpoint's metadata
    restarted = _source(clean)
    restarted.seek(pos, 0)                               # a run whose step counter starts again at 0
    for j in range(3):
        for g in range(full.cfg.micro_per_step):
            _same(resumed.micro_batch(k + j, g), full.micro_batch(k + j, g))
            _same(restarted.micro_batch(j, g), full.micro_batch(k + j, g))
    assert resumed.pixels.stats["stream"] > 1 and resumed.pixels.stats["eager"] == 0
    with pytest.raises(ValueError, match="saved data position is for 40 usable samples"):
        resumed.seek(dict(pos, num_samples=40), k)
    resumed.close()


def test_shape_facts_need_no_pixels_and_stream_equals_eager(clean):
    from hyperparallel.runconfig import load_parsed
    rc = load_parsed(RECIPE, overrides=_sets(clean)).run
    streamed, eager = _source(clean), _source(clean)
    streamed.will_read_pixels([0, 2, 3])
    for step in range(3):
        for g in range(4):
            mb = streamed.micro_batch(step, g)
            spec = rc.model.boundary("vision", rc.model.depth("vision"), mb)
            assert spec.shape == (mb.num_images, 32) and not mb.pixels_loaded   # meta only
            assert rc.model.boundary("llm", 4, mb).shape == (2, 40, 32) and not mb.pixels_loaded
            _same(mb, eager.micro_batch(step, g))
    assert streamed.pixels.stats["stream"] > 0 and streamed.pixels.stats["eager"] > 0   # micro 1: not hinted
    assert eager.pixels.stats["stream"] == 0
    streamed.close()


@pytest.mark.slow
def test_lazy_pixel_loading_runs_inside_the_data_hook(clean):
    """The bench times data apart from compute through the interpreter's hooks: every pixel load (lazy,
    on the model input's first read) happens inside a callable the interpreter wrapped as ``data``."""
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    from hyperparallel.bench.ranks.measure import local_plan
    from hyperparallel.runtime import compat
    from hyperparallel.runtime.comm import LocalComm
    from hyperparallel.runtime.hooks import Hooks
    from hyperparallel.runtime.rank import RankRuntime
    from hyperparallel.recipe import checked_plan
    from hyperparallel.runconfig import load_parsed
    compat.setup_device("CPU")
    recipe = load_parsed(RECIPE, overrides=_sets(clean))
    rc = recipe.run
    stack, seen = [], []

    class Categories(Hooks):
        def wrap(self, category, name, fn):
            def call(*a, **k):
                stack.append(category)
                try:
                    return fn(*a, **k)
                finally:
                    stack.pop()
            return call
    src = rc.source()
    load = src.load_patches
    src.load_patches = lambda *a, **kw: (seen.append(list(stack)), load(*a, **kw))[1]
    plan = local_plan(checked_plan(recipe, "1f1b"), "interleaved")
    RankRuntime(plan, rc.model, src, rc.train, LocalComm(), Categories()).step(0)
    src.close()
    assert len(seen) == plan.num_micro and all(s and s[-1] == "data" for s in seen), seen


@pytest.mark.slow
def test_loss_falls_on_the_demo_data(clean):
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    from hyperparallel.runtime import compat
    from hyperparallel.runconfig import load_parsed
    from hyperparallel.runtime.reference import Reference
    compat.setup_device("CPU")
    recipe = load_parsed(RECIPE, overrides=_sets(clean))
    ref = Reference(recipe.run, recipe.micro_batch_num, {r.name: True for r in recipe.profile.regions})
    losses = [ref.step(s)[0] for s in range(12)]
    assert np.isfinite(losses).all()
    assert np.mean(losses[-3:]) < 0.75 * np.mean(losses[:2]), losses


# -- 2 ranks, one msrun launch ------------------------------------------------------------------

def _case(tmp, paths, schedule, name, extra=(), **kw):
    return job_case(tmp, RECIPE, schedule, name, _sets(paths, [f"train.steps={STEPS}"] + list(extra)),
                    **dict(dict(steps=STEPS), **kw))


@pytest.fixture(scope="module")
def two_rank(tmp_path_factory, clean, broken):
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    tmp = str(tmp_path_factory.mktemp("conv2"))
    ckpt = os.path.join(tmp, "ckpt")
    skip = ["data.on_bad_sample=skip"]
    cases = [_case(tmp, clean, "1f1b", "1f1b"),
             _case(tmp, clean, "transpose", "transpose"),
             _case(tmp, clean, "transpose", "ckpt_first", steps=2, save_dir=ckpt, save_every=1),
             _case(tmp, clean, "transpose", "ckpt_resumed", save_dir=ckpt, resume=True),
             _case(tmp, broken, "transpose", "skip", skip, steps=2, run_dir=os.path.join(tmp, "run_skip"))]
    launch_cases(tmp, cases, 2, timeout=500)
    return {c["name"]: c for c in cases}


def _dumped(case):
    return dumped(case["dump_dir"])


def _reference(paths, extra=(), steps=STEPS):
    from hyperparallel.runtime import compat
    from hyperparallel.runconfig import load_parsed
    from hyperparallel.runtime.reference import Reference
    compat.setup_device("CPU")
    recipe = load_parsed(RECIPE, overrides=_sets(paths, list(extra)))
    ref = Reference(recipe.run, recipe.micro_batch_num, {r.name: True for r in recipe.profile.regions})
    out = [ref.step(s) for s in range(steps)]
    return [o[0] for o in out], out[0][1], [o[1] for o in out]   # losses, first, every step's grads


def _assert_matches(case, ref):
    grads = assert_equivalent(case, *ref)
    assert any(k.startswith("vision.") for k in grads)   # trained encoder


@pytest.mark.msrun
@pytest.mark.parametrize("schedule", ["1f1b", "transpose"])
def test_two_ranks_match_reference_on_conversations(two_rank, clean, schedule):
    _assert_matches(two_rank[schedule], _reference(clean))


@pytest.mark.msrun
def test_pixels_are_decoded_by_the_pipeline_only_where_the_encoder_starts(two_rank):
    """1f1b: the encoder is on rank 0 only; rank 1 never decodes an image. Every rank that
    does gets all its images from the prefetching mindspore.dataset pipeline."""
    for name in ("1f1b", "transpose"):
        d = two_rank[name]["dump_dir"]
        stats = [json.load(open(os.path.join(d, f"data_rank{r}.json"))) for r in (0, 1)]
        assert all(s["eager"] == 0 for s in stats), (name, stats)
        assert stats[0]["stream"] > 0, (name, stats)
        if name == "1f1b":
            assert stats[1]["stream"] == 0, stats


@pytest.mark.msrun
def test_two_ranks_resume_reads_the_next_samples(two_rank):
    first, _ = _dumped(two_rank["ckpt_first"])
    resumed, _ = _dumped(two_rank["ckpt_resumed"])
    full, _ = _dumped(two_rank["transpose"])
    assert resumed["start"] == 2 and len(resumed["losses"]) == STEPS - 2
    np.testing.assert_allclose(first["losses"] + resumed["losses"], full["losses"], rtol=1e-6)
    # the checkpoint's metadata holds the data position the resumed run continued from
    ckpt = two_rank["ckpt_first"]["save_dir"]
    with open(os.path.join(ckpt, "step_2", "meta.json")) as f:
        pos = json.load(f)["data_position"]
    assert {"epoch", "index", "num_samples"} <= set(pos) and pos["next_step"] == 2


@pytest.mark.msrun
def test_two_ranks_skip_bad_samples_and_count_them(two_rank, broken):
    case = two_rank["skip"]
    with open(os.path.join(case["run_dir"], "metrics.jsonl")) as f:
        lines = [json.loads(ln) for ln in f]
    assert [ln["step"] for ln in lines] == [1, 2] and all(ln["data_skipped"] == 6 for ln in lines)
    _assert_matches(case, _reference(broken, ["data.on_bad_sample=skip"], steps=2))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
