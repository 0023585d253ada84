"""The ``qwen_vl`` layout of conversations: Qwen's chat layout and labels, image grids from the headers,
pixel values equal to transformers' ``Qwen2VLImageProcessor``, the filler image, bad input, ``data check``
and resume. Data sets are written into temp dirs by ``tools/make_demo_data.py``; the data format is a dict
(no model needed): patch 4, temporal patch 2, merge 2, the demo tokenizer's fixed special ids.
"""
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hyperparallel.data import data_config, data_source
from hyperparallel.models.qwen_vl.batch import QwenVLBatch   # the family registers its qwen_vl layout
from hyperparallel.data.conversations import build_index, scan
from hyperparallel.data.index import check_image
from hyperparallel.models.qwen_vl.image import own_smart_resize
from hyperparallel.data.text import Tok
from hyperparallel.data.demo import write_demo

from helpers import ROOT

FMT = {"format": "qwen_vl", "patch_size": 4, "temporal_patch_size": 2, "merge_size": 2, "image_token_id": 10,
       "video_token_id": 11, "vision_start_token_id": 8, "vision_end_token_id": 9}
IM_START, IM_END, VS, VE, PAD_IMG, EOT = 6, 7, 8, 9, 10, 5
SMALL = {"min_pixels": 64, "max_pixels": 4096}   # demo images (16..32 pixels a side) keep their size
N = 24


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo(str(tmp_path_factory.mktemp("qwen")), N, seed=1, videos=False)


@pytest.fixture(scope="module")
def with_video(tmp_path_factory):
    return write_demo(str(tmp_path_factory.mktemp("qwen_video")), N, seed=1, broken=True, video_files=True)


def _cfg(paths, **keys):
    sec = dict(dict(type="conversations", seq_len=64, micro_batch_size=2, shuffle=False, **SMALL), **paths)
    sec.update(keys)
    return data_config({"data": {k: v for k, v in sec.items() if v is not None},
                        "parallel_config": {"micro_batch_num": 2}})


def _source(paths, fmt=FMT, seed=0, **keys):
    return data_source(_cfg(paths, **keys), seed, lambda: dict(fmt))


def _records(paths):
    out = []
    for ln in open(paths["path"]):
        try:
            out.append(json.loads(ln))
        except json.JSONDecodeError:   # the broken set's malformed line
            pass
    return out


def _processor(**kw):
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    return Qwen2VLImageProcessor(patch_size=4, temporal_patch_size=2, merge_size=2, **dict(SMALL, **kw))


def _reference(files, **kw):
    from PIL import Image
    ims = [Image.open(f) for f in files]
    out = _processor(**kw)(images=ims, return_tensors="np")
    return out["pixel_values"], out["image_grid_thw"]


def _image_of_size(paths, w, h):
    from PIL import Image
    for r in _records(paths):
        for f in ([r["image"]] if isinstance(r.get("image"), str) else r.get("image", [])):
            if Image.open(os.path.join(paths["image_root"], f)).size == (w, h):
                return f
    raise AssertionError(f"no {w}x{h} image in the demo set")


# -- chat layout and labels ----------------------------------------------------------------------

def test_demo_tokenizer_has_qwen_tokens_at_fixed_ids(demo):
    tok = Tok(demo["tokenizer"])
    fixed = ["<pad>", "<unk>", "</s>", "<image>", "<video>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
             "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    assert [tok.token_id(t) for t in fixed] == list(range(12))
    for role in ("system", "user", "assistant"):
        assert len(tok.encode(role)) == 1 and tok.encode(role)[0] >= 12


def test_chat_layout_and_labels_on_a_hand_made_sample(tmp_path, demo):
    img = _image_of_size(demo, 24, 16)   # 16 rows x 24 columns: grid (1, 4, 6), 6 image tokens
    recs = [{"id": "a", "image": img, "conversations": [
                {"from": "human", "value": "<image>\nwhat is this ?"}, {"from": "gpt", "value": "this is alpha ."},
                {"from": "human", "value": "name the pictures ."}, {"from": "gpt", "value": "alpha and beta ."}]},
            {"id": "b", "conversations": [
                {"from": "system", "value": "count from one to two ."},
                {"from": "human", "value": "what is this ?"}, {"from": "gpt", "value": "one two ."}]}]
    p = tmp_path / "hand.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    src = _source(dict(demo, path=str(p)), system_prompt="name the pictures .")
    mb = src.micro_batch(0, 0)
    assert isinstance(mb, QwenVLBatch) and mb.sample_ids == ["a", "b"]
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(demo["tokenizer"])

    def w(text):   # word ids looked up one by one (word-level tokenizer)
        ids = [tk.token_to_id(x) for x in text.split()]
        assert None not in ids, text
        return ids
    a_ids = ([IM_START] + w("system name the pictures .") + [IM_END] +
             [IM_START] + w("user") + [VS] + [PAD_IMG] * 6 + [VE] + w("what is this ?") + [IM_END] +
             [IM_START] + w("assistant this is alpha .") + [IM_END] +
             [IM_START] + w("user name the pictures .") + [IM_END] +
             [IM_START] + w("assistant alpha and beta .") + [IM_END])
    heads = len(w("assistant"))
    a_ans = [False] * len(a_ids)   # each answer's words and its <|im_end|>
    for start in [i for i, t in enumerate(a_ids) if t == IM_START and a_ids[i + 1] == w("assistant")[0]]:
        j = start + 1 + heads
        while a_ids[j] != IM_END:
            a_ans[j] = True
            j += 1
        a_ans[j] = True
    b_ids = ([IM_START] + w("system count from one to two .") + [IM_END] + [IM_START] + w("user what is this ?") +
             [IM_END] + [IM_START] + w("assistant one two .") + [IM_END])
    b_ans = [False] * (len(b_ids) - 4) + [True] * 4
    S = src.cfg.seq_len
    for b, (ids, ans) in enumerate([(a_ids, a_ans), (b_ids, b_ans)]):
        L = len(ids)
        assert mb.input_ids[b, :L].tolist() == ids and (mb.input_ids[b, L:] == EOT).all()
        assert mb.attention_mask[b].tolist() == [1] * L + [0] * (S - L)
        assert mb.labels[b].tolist() == [t if a else -100 for t, a in zip(ids, ans)] + [-100] * (S - L)
    # the same ids as the tokenizer gives the templated text (what Qwen's processor tokenizes)
    text = ("<|im_start|>system\nname the pictures .<|im_end|>\n<|im_start|>user\n<|vision_start|>"
            + "<|image_pad|>" * 6 + "<|vision_end|>\nwhat is this ?<|im_end|>\n<|im_start|>assistant\nthis is "
            "alpha .<|im_end|>\n<|im_start|>user\nname the pictures .<|im_end|>\n<|im_start|>assistant\nalpha and "
            "beta .<|im_end|>\n")
    assert tk.encode(text, add_special_tokens=False).ids == a_ids
    assert mb.input_ids.dtype == mb.attention_mask.dtype == mb.labels.dtype == np.int64
    assert mb.image_grid_thw.tolist() == [[1, 4, 6]] and mb.images_per_sample == [1, 0] and mb.extra_images == 0
    assert (mb.num_images, mb.num_patches, mb.num_image_tokens) == (1, 24, 6) and not mb.pixels_loaded
    src.close()


def test_image_tokens_follow_each_images_grid(demo):
    src = _source(demo)
    seen = set()
    for step in range(3):
        for g in range(2):
            mb = src.micro_batch(step, g)
            grids = mb.image_grid_thw[:mb.num_images - mb.extra_images].tolist()
            k = 0
            for b, n in enumerate(mb.images_per_sample):
                mine, k = grids[k:k + n], k + n
                seen |= {tuple(x) for x in mine}
                row = mb.input_ids[b]
                assert (row == PAD_IMG).sum() == sum(t * h * w // 4 for t, h, w in mine)
                assert (row == VS).sum() == (row == VE).sum() == n
                assert (mb.labels[b][row == PAD_IMG] == -100).all()
            assert mb.num_image_tokens == (mb.input_ids == PAD_IMG).sum()
            assert mb.num_patches == mb.image_grid_thw.prod(1).sum() and not mb.pixels_loaded
    assert {(1, 4, 4), (1, 6, 6), (1, 4, 6), (1, 8, 4)} <= seen   # square and non-square images
    src.close()


# -- grids and pixels ----------------------------------------------------------------------------

def test_own_smart_resize_equals_transformers():
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
    sizes = [(300, 500), (64, 40), (1080, 1920), (4000, 3000), (28, 28), (30, 2000), (16, 24), (32, 16), (7, 1300)]
    for h, w in sizes:
        for factor, lo, hi in [(28, 3136, 12845056), (8, 64, 4096), (8, 3136, 12845056), (8, 64, 256)]:
            assert own_smart_resize(h, w, factor, lo, hi) == smart_resize(h, w, factor, lo, hi), (h, w, factor)
    with pytest.raises(ValueError, match="aspect ratio"):
        own_smart_resize(2, 500, 8, 64, 4096)


@pytest.mark.parametrize("keys", [SMALL, {"min_pixels": 3136, "max_pixels": 12845056},
                                  {"min_pixels": 64, "max_pixels": 256}], ids=["keep", "upscale", "downscale"])
def test_grid_from_headers_equals_the_processors(demo, keys):
    src = _source(demo, seq_len=400, **keys)
    files = sorted({f for s in src.samples for f in s.files})
    want = {f: g for s in src.samples for f, g in zip(s.files, s.enc.grids)}
    _, grids = _reference(files, **keys)
    assert [want[f] for f in files] == [tuple(g) for g in grids.tolist()]
    assert len({tuple(g) for g in grids.tolist()}) >= 3
    src.close()


def test_pixel_values_equal_the_processor_bit_for_bit_stream_and_eager(demo):
    streamed, eager = _source(demo, num_parallel_workers=2), _source(demo)
    streamed.will_read_pixels([0, 1])
    for step in range(3):
        for g in range(2):
            for src in (streamed, eager):
                mb = src.micro_batch(step, g)
                files = src.files_of(step, g)
                if not files:
                    continue
                pv, grids = _reference(files)
                assert mb.pixel_values.dtype == np.float32 and mb.pixel_values.shape == pv.shape
                np.testing.assert_array_equal(mb.pixel_values, pv)
                np.testing.assert_array_equal(mb.image_grid_thw, grids)
    assert streamed.pixels.stats == {"stream": 6, "eager": 0}
    assert eager.pixels.stats == {"stream": 0, "eager": 6}
    streamed.close()
    eager.close()


def test_image_mean_and_std_reach_the_processor(demo):
    src = _source(demo, image_mean=[0.5, 0.5, 0.5], image_std=[0.25, 0.5, 1.0])
    mb = src.micro_batch(0, 0)
    pv, _ = _reference(src.files_of(0, 0), image_mean=[0.5, 0.5, 0.5], image_std=[0.25, 0.5, 1.0])
    np.testing.assert_array_equal(mb.pixel_values, pv)
    src.close()


def test_text_only_micro_batch_gets_an_unreferenced_filler_image(tmp_path, demo):
    recs = [r for r in _records(demo) if "image" not in r][:2]
    p = tmp_path / "text.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    src = _source(dict(demo, path=str(p)))
    mb = src.micro_batch(0, 0)
    assert mb.images_per_sample == [0, 0] and mb.extra_images == 1 and mb.num_images == 1
    assert mb.image_grid_thw.tolist() == [[1, 2, 2]] and mb.num_patches == 4 and mb.num_image_tokens == 0
    assert not np.isin(mb.input_ids, [PAD_IMG, VS, VE]).any()
    assert mb.pixel_values.shape == (4, 3 * 2 * 4 * 4) and not mb.pixel_values.any()
    src.close()


# -- bad input -----------------------------------------------------------------------------------

def test_tokenizer_without_a_qwen_token_or_with_other_ids_is_refused(tmp_path, demo, monkeypatch):
    from hyperparallel.data import demo as make_demo_data
    special = list(make_demo_data.SPECIAL)
    for missing in ("<|im_start|>", "<|endoftext|>"):
        monkeypatch.setattr(make_demo_data, "SPECIAL", [t for t in special if t != missing])
        path = str(tmp_path / f"tok{len(missing)}.json")
        make_demo_data.train_tokenizer(["user assistant system what is this"], path)
        with pytest.raises(ValueError, match=rf"^data.tokenizer: {re.escape(path)} has no {re.escape(missing)} "
                                             r"token"):
            _source(dict(demo, tokenizer=path))
    with pytest.raises(ValueError, match=r"^data.tokenizer: .*tokenizer\.json: <\|image_pad\|> is id 10 but the "
                                         r"model's image_token_id is 3$"):
        _source(demo, fmt=dict(FMT, image_token_id=3))
    with pytest.raises(ValueError, match=r"<\|vision_end\|> is id 9 but the model's vision_end_token_id is 99"):
        _source(demo, fmt=dict(FMT, vision_end_token_id=99))


def test_bad_pixel_keys_are_refused_naming_the_key(demo):
    with pytest.raises(ValueError, match=r"^data.min_pixels: 5000 > data.max_pixels 4096$"):
        _cfg(demo, min_pixels=5000)
    with pytest.raises(ValueError, match=r"^data.max_pixels: must be a whole number >= 1"):
        _cfg(demo, max_pixels=0)
    with pytest.raises(ValueError, match=r"^data.image_std: must be > 0"):
        _cfg(demo, image_std=[0.5, 0.0, 0.5])
    with pytest.raises(ValueError, match=r"^data.image_mean: a list of 3 numbers"):
        _cfg(demo, image_mean=[0.5, 0.5])
    with pytest.raises(ValueError, match=r"^data.system_prompt: no <image>"):
        _cfg(demo, system_prompt="look: <image>")


def test_shape_buckets_pad_the_merged_tokens_to_a_power_of_two_with_zero_filler_images(demo):
    """``data.shape_buckets: pow2`` (compiled chunks: bounded input shapes): each micro-batch's merged tokens (its
    images' t*h*w / m^2, the no-image filler included) padded up to a power of two with filler images of one merged
    token (grid (1, m, m), zero pixels, no image token); the real images, ids and labels unchanged; the cost model's
    ``encoder_patches`` says the padded count."""
    plain, padded = _source(demo), _source(demo, shape_buckets="pow2")
    m2, seen, padded_any = FMT["merge_size"] ** 2, set(), False
    for step in range(4):
        for micro in range(2):
            a, b = plain.micro_batch(step, micro), padded.micro_batch(step, micro)
            tokens = b.num_patches // m2
            assert tokens & (tokens - 1) == 0 and tokens >= a.num_patches // m2, (a.num_patches, b.num_patches)
            assert tokens < 2 * (a.num_patches // m2)   # the smallest power of two (the cap is not reached here)
            n_real = a.num_images - a.extra_images
            np.testing.assert_array_equal(b.image_grid_thw[:n_real], a.image_grid_thw[:n_real])
            assert (b.image_grid_thw[n_real:] == [1, FMT["merge_size"], FMT["merge_size"]]).all()
            assert b.extra_images == b.num_images - n_real and b.num_image_tokens == a.num_image_tokens
            for k in ("input_ids", "attention_mask", "labels"):
                np.testing.assert_array_equal(getattr(b, k), getattr(a, k))
            real = a.pixel_values[:sum(int(np.prod(g)) for g in a.image_grid_thw[:n_real])]
            np.testing.assert_array_equal(b.pixel_values[:len(real)], real)
            assert not b.pixel_values[len(real):].any() and b.pixel_values.shape[0] == b.num_patches
            assert padded.encoder_patches(a.num_patches - a.extra_images * m2) == b.num_patches
            seen.add(tokens)
            padded_any |= b.num_patches > a.num_patches
    assert padded_any and len(seen) >= 2
    plain.close()
    padded.close()


def test_keys_of_the_other_layout_are_refused(demo):
    with pytest.raises(ValueError, match=r"^data.image_size: does not apply to this model's qwen_vl micro-batches"):
        _source(demo, image_size=8)
    with pytest.raises(ValueError, match=r"^data.mean: does not apply to this model's qwen_vl"):
        _source(demo, mean=[0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match=r"^data.min_pixels: does not apply to this model's merge_index"):
        _source(demo, fmt={"format": "merge_index", "image_tokens": 1})
    merge = _source(demo, fmt={"format": "merge_index", "image_tokens": 1}, min_pixels=None, max_pixels=None)
    assert merge.micro_batch(0, 0).merge_index.shape == (2 * 64,)   # defaults of unused keys do not count
    merge.close()
    with pytest.raises(ValueError, match=r"^model: data_format\(\) format 'nope' unknown"):
        _source(demo, fmt={"format": "nope"})
    with pytest.raises(ValueError, match=r"^model.data_format\(\).merge_size: must be a whole number >= 1"):
        _source(demo, fmt=dict(FMT, merge_size=0))


def test_preprocessor_config_gives_defaults_and_must_match_the_model(tmp_path, demo):
    p = tmp_path / "preprocessor_config.json"
    p.write_text(json.dumps({"min_pixels": 100, "max_pixels": 2000, "patch_size": 4, "temporal_patch_size": 2,
                             "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                             "image_processor_type": "Qwen2VLImageProcessor"}))
    cfg = _cfg(demo, min_pixels=None, max_pixels=3000, preprocessor_config=str(p))
    assert (cfg.min_pixels, cfg.max_pixels, cfg.image_mean) == (100, 3000, [0.5, 0.5, 0.5])   # explicit wins
    assert cfg.check_format(FMT).patch_size == 4
    q3 = tmp_path / "qwen3.json"   # Qwen3-VL style: size.shortest_edge / longest_edge
    q3.write_text(json.dumps({"size": {"shortest_edge": 256, "longest_edge": 1024}, "patch_size": 4}))
    cfg = _cfg(demo, min_pixels=None, max_pixels=None, preprocessor_config=str(q3))
    assert (cfg.min_pixels, cfg.max_pixels) == (256, 1024)
    with pytest.raises(ValueError, match=rf"^data.preprocessor_config: {re.escape(str(q3))}: patch_size 4 but the "
                                         r"model's is 14$"):
        _source(demo, fmt=dict(FMT, patch_size=14), min_pixels=None, max_pixels=None, preprocessor_config=str(q3))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"do_normalize": False}))
    with pytest.raises(ValueError, match=r"^data.preprocessor_config: .*bad\.json: do_normalize False is not"):
        _cfg(demo, preprocessor_config=str(bad))
    with pytest.raises(ValueError, match=r"^data.preprocessor_config: file not found"):
        _cfg(demo, preprocessor_config=str(tmp_path / "none.json"))
    with pytest.raises(ValueError, match=r"^data.min_pixels: does not apply to this model's merge_index"):
        _source(demo, fmt={"format": "merge_index", "image_tokens": 1})


# -- videos --------------------------------------------------------------------------------------

PAD_VID = 11


def _frames(paths_or_arrays):
    from PIL import Image
    return [Image.open(p).convert("RGB") if isinstance(p, str) else Image.fromarray(p) for p in paths_or_arrays]


def _video_reference(frames, **kw):
    """The processor's video path on PIL frames (what Qwen's processor is given): (rows, grid)."""
    out = _processor(**kw)(images=None, videos=[_frames(frames)], return_tensors="np")
    return out["pixel_values_videos"], out["video_grid_thw"]


def test_demo_videos_train_as_qwens_processor_lays_them_out(with_video):
    """Every video sample of the demo set (frame lists and .mkv files) is usable; its <|video_pad|> group holds
    t*h*w/4 pads; the micro-batch's video rows are the processor's on the same frames, bit for bit."""
    recs = {r["id"]: r for r in _records(with_video)}
    src = _source(with_video, on_bad_sample="skip")
    assert sorted(p.kind for p in src.problems) == sorted(
        ["missing_image", "unreadable_image", "malformed_json", "placeholder_mismatch", "placeholder_mismatch",
         "too_long"])   # the broken samples only: no video is skipped
    vids = [s for s in src.samples if s.enc.videos]
    assert len(vids) == sum(1 for r in recs.values() if r.get("video"))
    kinds = {isinstance(s.enc.videos[0].source, str) for s in vids}
    assert kinds == {True, False}   # both a file and a frame list
    seen = 0
    for step in range(len(src.samples) // 4 + 1):
        for g in range(2):
            mb = src.micro_batch(step, g)
            samples = src.batch_samples(step, g)
            if not mb.num_videos:
                assert mb.pixel_values_videos is None
                continue
            want_rows, want_grid = [], []
            for s in samples:
                for v in s.enc.videos:
                    if isinstance(v.source, str):
                        from hyperparallel.data.video import read_frames
                        frames = read_frames(v.source, v.indices)   # lossless: the demo's frames
                    else:
                        frames = list(v.source)
                    pv, grid = _video_reference(frames)
                    want_rows.append(pv)
                    want_grid.append(grid[0])
            np.testing.assert_array_equal(mb.pixel_values_videos, np.concatenate(want_rows))
            np.testing.assert_array_equal(mb.video_grid_thw, np.asarray(want_grid))
            assert mb.pixel_values_videos.dtype == np.float32
            assert mb.num_patches == mb.image_patches + int(mb.video_grid_thw.prod(axis=1).sum())
            assert mb.encoder_pixels.shape[0] == mb.num_patches
            for b, s in enumerate(samples):   # one group per video: <|vision_start|> pads <|vision_end|>
                ids = mb.input_ids[b].tolist()
                for v in s.enc.videos:
                    n = int(np.prod(v.grid)) // 4
                    k = ids.index(PAD_VID)
                    assert ids[k - 1] == VS and ids[k:k + n] == [PAD_VID] * n and ids[k + n] == VE
                assert (mb.labels[b][mb.input_ids[b] == PAD_VID] == -100).all()
            assert int((mb.input_ids == PAD_VID).sum()) == mb.num_video_tokens
            seen += mb.num_videos
    assert seen >= 2
    frames_list = next(s for s in vids if not isinstance(s.enc.videos[0].source, str)).enc.videos[0]
    assert frames_list.second_per_grid_t == 2 / 2.0   # temporal_patch_size / data.fps
    assert frames_list.grid[0] == -(-len(frames_list.source) // 2)   # padded to whole temporal patches
    src.close()


def test_a_video_of_identical_frames_is_its_image(tmp_path, demo):
    """Independent of the processor's video path: 2 copies of one frame give the image's rows (an image is
    repeated temporal_patch_size times in time)."""
    img = os.path.join(demo["image_root"], _image_of_size(demo, 24, 16))
    rec = {"id": "v", "video": [os.path.relpath(img, demo["image_root"])] * 2,
           "conversations": [{"from": "human", "value": "<video>\nwhat moves ?"}, {"from": "gpt", "value": "alpha ."}]}
    p = tmp_path / "v.jsonl"
    p.write_text(json.dumps(rec) + "\n" + json.dumps(dict(rec, id="w")) + "\n")
    mb = _source(dict(demo, path=str(p))).micro_batch(0, 0)
    pv, grid = _reference([img])
    np.testing.assert_array_equal(mb.pixel_values_videos[:len(pv)], pv)
    assert mb.video_grid_thw.tolist() == [grid[0].tolist()] * 2 and mb.extra_images == 0 and mb.num_images == 0


def _video_file(tmp_path, name, n, fps, size=(16, 24)):
    from hyperparallel.data.video import write_video
    rng = np.random.default_rng(n)
    frames = [rng.integers(0, 256, size + (3,), dtype=np.uint8) for _ in range(n)]
    write_video(str(tmp_path / name), frames, fps)
    return frames


def _video_set(tmp_path, demo, videos):
    ask = [{"from": "human", "value": "<video>\nwhat moves ?"}, {"from": "gpt", "value": "alpha ."}]
    p = tmp_path / "videos.jsonl"
    p.write_text("".join(json.dumps({"id": f"v{i}", "video": v, "conversations": ask}) + "\n"
                         for i, v in enumerate(videos)))
    return dict(demo, path=str(p), image_root=str(tmp_path))


@pytest.mark.parametrize("total,rate,keys", [(30, 10, {}), (13, 4, {}), (15, 4, {}), (50, 25, {"fps": 1.0}),
                                             (40, 8, {"max_frames": 6}), (9, 30, {"min_frames": 6})],
                         ids=["fps", "odd", "rounded-up", "fps-key", "max", "min"])
def test_video_file_frames_follow_qwens_sampling_rule(tmp_path, demo, total, rate, keys):
    """A video file: the frames taken are qwen_vl_utils' (mindone's copy: smart_nframes, then
    round(linspace(0, total - 1, n))), their rows the processor's on those frames, and second_per_grid_t
    = temporal_patch_size / (n / total * video_fps)."""
    pytest.importorskip("mindone")
    from mindone.transformers.models.qwen2_vl.qwen_vl_utils.vision_process import smart_nframes
    frames = _video_file(tmp_path, "a.mkv", total, rate)
    src = _source(_video_set(tmp_path, demo, ["a.mkv", "a.mkv"]), **keys)
    v = src.samples[0].enc.videos[0]
    ele = {k: keys[k] for k in ("fps", "min_frames", "max_frames") if k in keys}
    n = smart_nframes(ele, total_frames=total, video_fps=rate)
    assert v.indices == tuple(np.linspace(0, total - 1, n).round().astype(int).tolist())
    assert v.second_per_grid_t == pytest.approx(2 / (n / total * rate))
    mb = src.micro_batch(0, 0)
    pv, grid = _video_reference([frames[i] for i in v.indices])
    np.testing.assert_array_equal(mb.pixel_values_videos[:len(pv)], pv)
    assert mb.video_grid_thw.tolist() == [grid[0].tolist()] * 2
    np.testing.assert_allclose(mb.second_per_grid_ts, [v.second_per_grid_t] * 2)
    src.close()


def test_per_frame_video_layout_puts_each_steps_timestamp_before_its_group(tmp_path, demo):
    """Qwen3-VL (video_layout per_frame): a group per temporal grid step, after '<{s:.1f} seconds>' as text;
    the seconds are Qwen3VLProcessor._calculate_timestamps' of the frames taken."""
    pytest.importorskip("mindone")
    from mindone.transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    _video_file(tmp_path, "a.mkv", 30, 10)
    paths = _video_set(tmp_path, demo, ["a.mkv", "a.mkv"])
    src = _source(paths, fmt=dict(FMT, video_layout="per_frame"))
    v = src.samples[0].enc.videos[0]
    secs = Qwen3VLProcessor._calculate_timestamps(None, list(v.indices), 10.0, 2)
    assert v.timestamps(2) == pytest.approx(secs) and len(secs) == v.grid[0] == 3
    tok = Tok(paths["tokenizer"])
    ids = src.micro_batch(0, 0).input_ids[0].tolist()
    per = v.grid[1] * v.grid[2] // 4
    text = [tok.encode(f"<{t:.1f} seconds>") for t in secs]
    first = ids.index(VS)
    k = first - len(text[0])
    assert ids[k:first] == tok.encode("\n<0.0 seconds>")[-len(text[0]):] or ids[k:first] == text[0]
    for t in range(3):
        start = ids.index(VS, k)
        assert ids[start + 1:start + 1 + per] == [PAD_VID] * per and ids[start + 1 + per] == VE
        if t:
            assert ids[k:start] == text[t]
        k = start + per + 2
    grouped = _source(paths)   # Qwen2.5-VL: one group of every step
    g = grouped.micro_batch(0, 0).input_ids[0].tolist()
    assert g.count(VS) == 1 and g.count(PAD_VID) == 3 * per
    src.close()
    grouped.close()


def test_bad_videos_are_bad_samples_naming_the_file(tmp_path, demo):
    _video_file(tmp_path, "ok.mkv", 8, 4)
    _video_file(tmp_path, "one.mkv", 1, 4)
    (tmp_path / "junk.mkv").write_bytes(b"not a video at all")
    from PIL import Image
    Image.new("RGB", (16, 16)).save(tmp_path / "f16.png")
    Image.new("RGB", (24, 24)).save(tmp_path / "f24.png")
    paths = _video_set(tmp_path, demo, ["ok.mkv", "junk.mkv", "gone.mkv", "one.mkv", ["f16.png"] * 5,
                                        ["f16.png", "f24.png"], "ok.mkv"])
    with pytest.raises(ValueError, match=r"^data: 5 bad sample\(s\) .*\(bad_video 2, missing_video 1, "
                                         r"too_many_frames 1, undecodable_video 1\); first: .*:2 \(id v1\): "
                                         r"undecodable_video: field 'video': .*junk\.mkv: not a readable video"):
        _source(paths, max_frames=4)
    src = _source(paths, max_frames=4, on_bad_sample="skip")
    got = {p.where.split("(id ")[1].rstrip(")"): (p.kind, p.message) for p in src.problems}
    assert {k: kind for k, (kind, _) in got.items()} == {"v1": "undecodable_video", "v2": "missing_video",
                                                         "v3": "bad_video", "v4": "too_many_frames", "v5": "bad_video"}
    assert "gone.mkv" in got["v2"][1] and "one.mkv" in got["v3"][1] and "needs 2 to 1" in got["v3"][1]
    assert got["v4"][1] == "field 'video': 5 frame images > data.max_frames 4"
    assert "frame 1" in got["v5"][1] and "24x24 pixels but frame 0 is 16x16" in got["v5"][1]
    assert all("\n" not in m for _, m in got.values()) and src.skipped == 5 and len(src.samples) == 2
    src.close()


def test_bad_video_keys_are_refused_naming_the_key(demo):
    with pytest.raises(ValueError, match=r"^data.fps: frames sampled per second of a video file: a number > 0"):
        _cfg(demo, fps=0)
    with pytest.raises(ValueError, match=r"^data.min_frames: 8 > data.max_frames 6$"):
        _cfg(demo, min_frames=8, max_frames=6)
    with pytest.raises(ValueError, match=r"^data.max_frames: must be a whole number >= 1"):
        _cfg(demo, max_frames=0)


def test_video_replaced_after_the_index_stops_the_run_naming_it(tmp_path, demo):
    _video_file(tmp_path, "a.mkv", 8, 4)
    src = _source(_video_set(tmp_path, demo, ["a.mkv", "a.mkv"]))
    _video_file(tmp_path, "a.mkv", 8, 4, size=(40, 40))
    with pytest.raises(RuntimeError, match=r"^data: video .*a\.mkv: grid_mismatch: the processor's grid \(2, 10, 10\)"):
        src.micro_batch(0, 0).pixel_values_videos
    src.close()


def test_too_long_counts_the_image_tokens(demo):
    samples, problems = build_index(_cfg(demo, seq_len=30, on_bad_sample="skip"), FMT)
    assert problems and all(p.kind == "too_long" and "> data.seq_len 30" in p.message for p in problems)
    assert all(s.enc.length <= 30 for s in samples)


def _one_image_set(tmp_path, demo, w, h):
    """A .jsonl of one sample showing one random ``w`` x ``h`` PNG (in ``tmp_path``), with the demo tokenizer."""
    from PIL import Image
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (h, w, 3), np.uint8)).save(tmp_path / "im.png")
    p = tmp_path / "one.jsonl"
    p.write_text(json.dumps({"id": "one", "image": "im.png", "conversations": [
        {"from": "human", "value": "<image>\nwhat is this ?"}, {"from": "gpt", "value": "this is beta ."}]}) + "\n")
    return dict(demo, path=str(p), image_root=str(tmp_path))


def test_an_image_smaller_than_one_merged_patch_is_too_small_by_its_header(tmp_path, demo):
    paths = _one_image_set(tmp_path, demo, 1, 1)
    n, samples, problems = scan(_cfg(paths), FMT)   # data check (processor run); before: undecodable_image
    assert n == 1 and not samples
    assert [str(p) for p in problems] == [
        f"{paths['path']}:1 (id one): image_too_small: {tmp_path / 'im.png'} is 1x1 pixels; the qwen_vl layout "
        "needs each side >= patch_size x merge_size = 4 x 2 = 8 pixels"]
    samples, problems = build_index(_cfg(paths), FMT)   # the run's index refuses it the same way, from the header
    assert [p.kind for p in problems] == ["image_too_small"]


def test_an_image_three_pixels_high_is_not_read_as_channels_first(tmp_path, demo):
    fmt = dict(FMT, patch_size=1)   # merged patch 2 x 2: a 16 x 3 image is big enough
    paths = _one_image_set(tmp_path, demo, 16, 3)
    n, samples, problems = scan(_cfg(paths, min_pixels=4), fmt)   # the processor's guess: grid_mismatch
    assert n == 1 and problems == [] and samples[0].enc.grids == ((1, 4, 16),)
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    ref = Qwen2VLImageProcessor(patch_size=1, temporal_patch_size=2, merge_size=2, min_pixels=4, max_pixels=4096)(
        images=[Image.open(tmp_path / "im.png")], return_tensors="np", input_data_format="channels_last")
    assert ref["image_grid_thw"].tolist() == [[1, 4, 16]]   # told the layout, the processor agrees with the header
    src = _source(paths, fmt=fmt, min_pixels=4)
    mb = src.micro_batch(0, 0)   # both rows are the one sample
    assert mb.image_grid_thw.tolist() == [[1, 4, 16]] * 2
    np.testing.assert_array_equal(mb.pixel_values, np.concatenate([ref["pixel_values"]] * 2))
    src.close()


# -- data check, run-time grid check, resume ---------------------------------------------------

ADAPTER = '''
from hyperparallel.models.base import ModelAdapter, Region


class QwenFormat(ModelAdapter):
    """Only what data check needs: regions and the qwen_vl data format."""
    family = "qwen_format_stub"

    def __init__(self, section, shapes, seed):
        pass

    def regions(self):
        return [Region("vision", 1), Region("llm", 2)]

    def data_format(self):
        return {FMT!r}
'''

RECIPE = '''
device: CPU
parallel_config: {{pipeline_stage: 2, micro_batch_num: 2, pp_interleave_num: 1, data_parallel: 1}}
mpipe:
  schedule: 1f1b
  profile:
    regions:
      - {{name: vision, layers: 1, trainable: true, forward_ms: 1.0, backward_ms: 1.0, weight_ms: 0.5,
         activation_mb: 0.1, output_mb: 0.01, param_mb: 0.1}}
      - {{name: llm, layers: 2, trainable: true, forward_ms: 1.0, backward_ms: 1.0, weight_ms: 0.5,
         activation_mb: 0.1, output_mb: 0.01, param_mb: 0.1}}
model: {{adapter: "qwen_stub:QwenFormat"}}
data:
  type: conversations
  path: {path}
  image_root: {image_root}
  tokenizer: {tokenizer}
  seq_len: 64
  micro_batch_size: 2
  min_pixels: 64
  max_pixels: 4096
train: {{seed: 0, steps: 1}}
'''


def test_data_check_on_a_qwen_format_recipe(tmp_path, demo, with_video):
    (tmp_path / "qwen_stub.py").write_text(textwrap.dedent(ADAPTER.replace("{FMT!r}", repr(FMT))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path)]))
    out = {}
    for name, paths, sets in (("clean", demo, []), ("bad", with_video, []),
                              ("key", demo, ["--set", "data.patch=4"])):
        rec = tmp_path / f"{name}.yaml"
        rec.write_text(RECIPE.format(**paths))
        out[name] = subprocess.run([sys.executable, "-m", "hyperparallel", "data", "check", str(rec), *sets],
                                   cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    r = out["clean"]
    assert r.returncode == 0 and f"{N} samples, {N} usable, 0 with problems" in r.stdout, r.stderr
    r = out["bad"]
    videos = sum(1 for x in _records(with_video) if x.get("video"))
    assert r.returncode == 1, r.stderr
    assert videos and ("problems by kind: malformed_json 1, missing_image 1, placeholder_mismatch 2, too_long 1, "
                       "unreadable_image 1 (") in r.stderr, r.stderr   # every video decoded, none a problem
    r = out["key"]   # a key the model's layout does not read is a bad argument
    assert r.returncode == 2 and "error: data.patch: does not apply to this model's qwen_vl" in r.stderr, r.stderr


def test_scan_reports_a_grid_the_processor_disagrees_with(demo, monkeypatch):
    from hyperparallel.models.qwen_vl import image as qwen_image

    real = qwen_image.QwenPixels.__call__

    def off_by_one(self, data):   # a processor that resizes differently from the header rule
        pv, grid = real(self, data)
        return pv, grid + np.asarray([0, 2, 0])
    monkeypatch.setattr(qwen_image.QwenPixels, "__call__", off_by_one)
    n, samples, problems = scan(_cfg(demo), FMT)
    with_images = sum(1 for r in _records(demo) if "image" in r)
    assert n == N and len(problems) == with_images and {p.kind for p in problems} == {"grid_mismatch"}
    assert re.search(r"images/s\d+_\d\.png: the processor's grid \(1, \d+, \d+\) is not \(1, \d+, \d+\) from the "
                     r"image header", problems[0].message)


def test_image_replaced_after_the_index_stops_the_run_naming_it(tmp_path):
    from PIL import Image
    paths = write_demo(str(tmp_path), 12, seed=2, videos=False)
    src = _source(paths)
    victim = next(f for g in range(2) for f in src.files_of(1, g))
    Image.new("RGB", (40, 40), (9, 9, 9)).save(victim)   # a valid image of another size
    with pytest.raises(RuntimeError, match=rf"^data: image {re.escape(victim)}: grid_mismatch: the processor's "
                                           r"grid \(1, 10, 10\)"):
        for g in range(2):
            src.micro_batch(1, g).pixel_values
    src.close()


def _same(x, y):
    for f in ("input_ids", "attention_mask", "labels", "image_grid_thw", "pixel_values"):
        np.testing.assert_array_equal(getattr(x, f), getattr(y, f))
    assert x.images_per_sample == y.images_per_sample and x.sample_ids == y.sample_ids


def test_resume_position_and_seek(demo):
    full = _source(demo, shuffle=True)
    k = 5   # 4 samples per step over 24: step 6 starts epoch 1
    pos = full.position(k)
    assert pos == {"epoch": 0, "index": 20, "num_samples": N}
    assert full.position(6) == {"epoch": 1, "index": 0, "num_samples": N}
    resumed = _source(demo, shuffle=True)
    resumed.will_read_pixels([0, 1])
    resumed.micro_batch(0, 0).pixel_values            # its pipeline already reads ahead from step 0
    resumed.seek(json.loads(json.dumps(pos)), k)
    restarted = _source(demo, shuffle=True)
    restarted.seek(pos, 0)
    for j in range(2):
        for g in range(2):
            _same(resumed.micro_batch(k + j, g), full.micro_batch(k + j, g))
            _same(restarted.micro_batch(j, g), full.micro_batch(k + j, g))
    assert resumed.pixels.stats["stream"] > 1 and resumed.pixels.stats["eager"] == 0
    with pytest.raises(ValueError, match="saved data position is for 20 usable samples"):
        resumed.seek(dict(pos, num_samples=20), k)
    for s in (full, resumed, restarted):
        s.close()


def test_header_size_is_width_then_height(demo):
    img = os.path.join(demo["image_root"], _image_of_size(demo, 16, 32))
    assert check_image(img) == (16, 32)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_qwen_answer_tokens_and_encoder_work_from_the_index(demo):
    """``train.loss_normalization: tokens`` and ``data.balance: encoder`` on the qwen_vl layout: the index's
    answer-token count is the labels the model's shifted loss counts, a sample's encoder work the patches
    of its grids (each image at its own resolution), and a balanced step holds the same samples."""
    src = _source(demo)
    G = src.cfg.micro_per_step
    for step in range(3):
        for g in range(G):
            mb = src.micro_batch(step, g)
            assert src.loss_tokens(step, g) == int((mb.labels[:, 1:] != -100).sum()) == mb.loss_tokens > 0
        work = src.encoder_work(step)
        grids = [int(np.prod(gr)) for s in src.step_samples(step) for gr in s.enc.grids]
        assert sum(work) == sum(grids) and len(set(work)) > 1   # images of different sizes
    bal = _source(demo)
    bal.balance_by([0, 1])
    for step in range(3):
        ids = sorted(s.id for g in range(G) for s in bal.batch_samples(step, g))
        assert ids == sorted(s.id for g in range(G) for s in src.batch_samples(step, g))
        assert sum(bal.micro_batch(step, g).num_patches - bal.micro_batch(step, g).extra_images * 4
                   for g in range(G)) == sum(src.encoder_work(step))


# -- packed sequences (data.packing) ---------------------------------------------------------------

def _first_fit(lengths, cap):
    """First-fit in order, written out plainly (the test's own packing)."""
    bins, room = [], []
    for i, n in enumerate(lengths):
        for k, r in enumerate(room):
            if r >= n:
                bins[k].append(i)
                room[k] -= n
                break
        else:
            bins.append([i])
            room.append(cap - n)
    return bins


def test_packing_fills_sequences_first_fit_in_data_order_with_the_samples_unchanged(demo):
    """Each micro-batch's rows are the epoch's first-fit bins in data order; each row holds its samples'
    ids and labels as unpacked, one after another (a sample's first label -100), padding after; answer
    tokens, samples and real tokens per step are those of its samples; the same on every build."""
    S = 128
    plain, packed = _source(demo, seq_len=S), _source(demo, seq_len=S, packing=True)
    bins = _first_fit([s.enc.length for s in plain.samples], S)   # shuffle false: file order
    assert len(bins) < N // 3   # several samples per sequence on this set
    bins = bins * 3   # every epoch packs alike (file order); steps run on into the next epoch
    B, G = 2, 2
    for step in range(2):
        for g in range(G):
            mb = packed.micro_batch(step, g)
            want = bins[(step * G + g) * B:(step * G + g + 1) * B]
            assert [[plain.samples[k].enc.length for k in row] for row in want] == mb.segments
            assert mb.sample_ids == [plain.samples[k].id for row in want for k in row]
            assert mb.input_ids.shape == (B, S) and mb.images_per_sample == \
                [len(plain.samples[k].files) for row in want for k in row]
            for b, row in enumerate(want):
                off = 0
                for k in row:
                    e = plain.samples[k].enc
                    L = e.length
                    np.testing.assert_array_equal(mb.input_ids[b, off:off + L], e.ids)
                    lab = np.where(e.answer, e.ids, -100)
                    lab[0] = -100
                    np.testing.assert_array_equal(mb.labels[b, off:off + L], lab)
                    off += L
                assert (mb.attention_mask[b, :off] == 1).all() and (mb.attention_mask[b, off:] == 0).all()
                assert (mb.input_ids[b, off:] == EOT).all() and (mb.labels[b, off:] == -100).all()
            grids = [g_ for row in want for k in row for g_ in plain.samples[k].enc.grids]
            assert [tuple(x) for x in mb.image_grid_thw[:len(grids)]] == grids
            n_ans = sum(plain.samples[k].loss_tokens for row in want for k in row)
            assert packed.loss_tokens(step, g) == mb.loss_tokens == n_ans > 0
        c = packed.step_counts(step)
        rows = bins[step * G * B:(step + 1) * G * B]
        assert c == {"samples": sum(map(len, rows)), "real_tokens": sum(plain.samples[k].enc.length
                                                                        for r in rows for k in r)}
        assert c["samples"] > G * B == plain.step_counts(step)["samples"]
    # the unpacked form of a packed micro-batch: the same samples one per row, as the plain source lays them out
    mb = packed.micro_batch(0, 0)
    u = mb.unpacked()
    ids = mb.sample_ids
    ref = _source(dict(demo), seq_len=S)
    rows = [next(s for s in ref.samples if s.id == i) for i in ids]
    for r, s in enumerate(rows):
        np.testing.assert_array_equal(u.input_ids[r, :s.enc.length], s.enc.ids)
        lab = np.where(s.enc.answer, s.enc.ids, -100)
        np.testing.assert_array_equal(u.labels[r, 1:s.enc.length], lab[1:])
    assert u.loss_tokens == mb.loss_tokens and u.segments is None
    np.testing.assert_array_equal(u.image_grid_thw, mb.image_grid_thw)
    np.testing.assert_array_equal(u.pixel_values, mb.pixel_values)   # one decode: the packed batch's pixels
    again = _source(demo, seq_len=S, packing=True)
    assert again.micro_batch(1, 1).sample_ids == packed.micro_batch(1, 1).sample_ids
    for s in (plain, packed, ref, again):
        s.close()


def test_packing_shuffled_visits_every_sample_once_per_epoch_and_resumes(demo):
    S = 96
    src = _source(demo, seq_len=S, packing=True, shuffle=True)
    for epoch in (0, 1):
        rows = src.packs.rows(epoch)
        assert sorted(k for r in rows for k in r) == list(range(N))
        assert all(sum(src.samples[k].enc.length for k in r) <= S for r in rows)
        order = list(src.order(epoch))
        assert rows == [[order[i] for i in b] for b in _first_fit([src.samples[k].enc.length for k in order], S)]
    assert src.packs.rows(0) != src.packs.rows(1)   # each epoch its own permutation, packed
    k = 3
    pos = src.position(k)
    assert pos["packed"] is True and set(pos) == {"epoch", "index", "num_samples", "packed"}
    resumed = _source(demo, seq_len=S, packing=True, shuffle=True)
    resumed.seek(json.loads(json.dumps(pos)), k)
    for j in range(3):
        for g in range(2):
            a, b = resumed.micro_batch(k + j, g), src.micro_batch(k + j, g)
            assert a.sample_ids == b.sample_ids and a.segments == b.segments
            np.testing.assert_array_equal(a.input_ids, b.input_ids)
    plain = _source(demo, seq_len=S, shuffle=True)
    with pytest.raises(ValueError, match=r"^data.packing: the saved data position is with packing, this run is "
                                         "without"):
        plain.seek(pos, k)
    with pytest.raises(ValueError, match=r"^data.packing: the saved data position is without packing"):
        resumed.seek(plain.position(k), k)
    for s in (src, resumed, plain):
        s.close()


def test_packing_a_sample_longer_than_seq_len_is_a_bad_sample(demo):
    """Never split: under on_bad_sample error the run is refused naming the sample and data.seq_len; under
    skip it is counted and left out of every sequence."""
    with pytest.raises(ValueError, match=r"^data: \d+ bad sample\(s\) in .*too_long.*first: .*train.jsonl:\d+ "
                                         r"\(id s\d+\): too_long: \d+ tokens .*> data.seq_len 30"):
        _source(demo, seq_len=30, packing=True)
    src = _source(demo, seq_len=30, packing=True, on_bad_sample="skip")
    samples, problems = build_index(_cfg(demo, seq_len=30, on_bad_sample="skip"), FMT)
    assert src.skipped == len(problems) > 0 and len(src.samples) == len(samples)
    mb = src.micro_batch(0, 0)
    assert all(sum(r) <= 30 for r in mb.segments)
    assert not set(mb.sample_ids) & {p.where.split("(id ")[1].rstrip(")") for p in problems}
    src.close()


@pytest.mark.parametrize("keys,match", [
    (dict(packing="yes"), r"^data.packing: true or false, got 'yes'"),
    (dict(packing=True, balance="encoder"), r"^data.packing: true with data.balance encoder"),
])
def test_packing_bad_values_are_refused_naming_the_key(demo, keys, match):
    with pytest.raises(ValueError, match=match):
        _cfg(demo, **keys)


def test_packing_is_refused_where_it_is_not_done(demo):
    """Synthetic data, the merge_index layout (tiny MLLM, MindFormers' Llama), and a qwen_vl model with flash
    attention: one line naming data.packing."""
    with pytest.raises(ValueError, match=r"^data.packing: packs the samples of a data set \(data.type: "
                                         "conversations\\)"):
        data_config({"data": {"packing": True}})
    with pytest.raises(ValueError, match=r"^data.packing: true: merge_index micro-batches are not packed"):
        data_source(_cfg(demo, packing=True, **{k: None for k in SMALL}), 0, lambda: 1)
    from hyperparallel.runconfig import load_parsed
    paths = [f"data.{k}={v}" for k, v in sorted(demo.items())]
    tiny = os.path.join(ROOT, "recipes", "tiny_mllm_data.yaml")
    with pytest.raises(ValueError, match=r"^data.packing: true with data.shape_buckets pow2: not done"):
        load_parsed(tiny, paths + ["data.packing=true"]).run   # the recipe's buckets
    with pytest.raises(ValueError, match=r"^data.packing: true: the tiny_mllm model does not take packed sequences "
                                         r"\(its attention would cross samples\); set data.packing: false$"):
        load_parsed(tiny, paths + ["data.packing=true", "data.shape_buckets=none"]).run
    q25 = os.path.join(ROOT, "recipes", "qwen2_5_vl_tiny.yaml")
    assert load_parsed(q25, paths + ["data.packing=true"]).run.data.packing is True
    with pytest.raises(ValueError, match=r"^data.packing: true with model.model_config.attn_implementation "
                                         "'flash_attention_2'"):
        load_parsed(q25, paths + ["data.packing=true", "device=Ascend",
                                                "model.model_config.attn_implementation=flash_attention_2"]).run


def test_train_with_packing_refuses_a_too_long_sample_before_launch_in_one_line(demo):
    """``hyperparallel train`` with packing: a sample longer than data.seq_len stops it before msrun starts (exit
    2), one line naming the sample and data.seq_len, and where on_bad_sample: skip would leave it out."""
    q25 = os.path.join(ROOT, "recipes", "qwen2_5_vl_tiny.yaml")
    sets = [a for k, v in sorted(demo.items()) for a in ("--set", f"data.{k}={v}")]
    res = subprocess.run([sys.executable, "-m", "hyperparallel", "train", q25, *sets, "--set", "data.packing=true",
                          "--set", "data.seq_len=30", "--set", "data.on_bad_sample=error"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, GLOG_v="3"))
    err = [ln for ln in res.stderr.splitlines() + res.stdout.splitlines() if ln.startswith("error:")]
    assert res.returncode == 2, res.stdout + res.stderr
    assert len(err) == 1 and re.match(r"error: data: \d+ bad sample\(s\) in .*train.jsonl \(too_long \d+\); first: "
                                      r".*train.jsonl:\d+ \(id s\d+\): too_long: \d+ tokens .*> data.seq_len 30 "
                                      r".*data.on_bad_sample=skip", err[0]), err
    assert "job finished" not in res.stdout and "hyperparallel worker rank" not in res.stdout + res.stderr


def test_scan_decodes_every_video_file(with_video, monkeypatch):
    """``data check`` decodes each video file once: a processor grid other than the index's is a problem of
    that sample, named; frame lists are checked as images."""
    from hyperparallel.models.qwen_vl import video as qwen_video
    real = qwen_video.QwenVideoPixels.__call__

    def off(self, frames):
        pv, grid = real(self, frames)
        return pv, grid + np.asarray([1, 0, 0])
    monkeypatch.setattr(qwen_video.QwenVideoPixels, "__call__", off)
    _, samples, problems = scan(_cfg(with_video, on_bad_sample="skip"), FMT)
    files = [r["id"] for r in _records(with_video) if isinstance(r.get("video"), str)]
    bad = [p for p in problems if p.kind == "undecodable_video"]
    assert files and sorted(p.where.split("(id ")[1].rstrip(")") for p in bad) == sorted(files)
    assert re.search(r"video .*images/s\d+\.mkv: grid_mismatch: the processor's grid \(\d, \d, \d\) is not",
                     bad[0].message), bad[0].message
    assert not any(isinstance(s.enc.videos[0].source, str) for s in samples if s.enc.videos)


def test_encoder_work_and_boundaries_follow_the_videos_grids(with_video):
    """A video's patches are encoder work (data.balance: encoder reads them) and size the encoder's boundary
    tensors: the last vision chunk hands the LLM every image's and video's merged tokens."""
    from hyperparallel.models import adapter_for
    from hyperparallel.recipe import load_recipe
    raw = load_recipe(os.path.join(ROOT, "recipes", "qwen2_5_vl_tiny.yaml")).raw
    model = adapter_for(raw["model"], {}, 0)
    src = _source(with_video, on_bad_sample="skip")
    s = next(s for s in src.samples if s.enc.videos)
    assert src.sample_patches(s) == int(np.prod(s.enc.videos[0].grid)) > 0
    step, g = next((st, g) for st in range(6) for g in range(2) if src.micro_batch(st, g).num_videos)
    mb = src.micro_batch(step, g)
    video_patches = int(mb.video_grid_thw.prod(axis=1).sum())
    assert video_patches and mb.num_patches == mb.image_patches + video_patches
    assert sum(src.sample_patches(x) for x in src.batch_samples(step, g)) == mb.num_patches - 4 * mb.extra_images
    depth = model.vision.depth
    assert model.boundary("vision", depth, mb).shape == (mb.num_patches // 4, model.text.hidden_size)
    assert model.boundary("vision", 1, mb).shape == (mb.num_patches, model.vision.hidden_size)
    src.close()


def test_a_packed_micro_batch_keeps_its_videos_when_unpacked():
    """Packing and videos together: the unpacked form (M-RoPE per sample, the reference's call) holds the same
    videos in the same order, their frame spacing, and the packed batch's decoded video pixels (one decode)."""
    calls = []

    def load_videos():
        calls.append(1)
        return np.arange(2 * 16 * 4, dtype=np.float32).reshape(32, 4)

    ids = np.zeros((1, 12), np.int64)
    mb = QwenVLBatch(ids, np.ones((1, 12), np.int64), np.full((1, 12), -100, np.int64), np.zeros((0, 3)), [0, 0], 2,
                     load=lambda: np.zeros((0, 4), np.float32), segments=[[5, 7]],
                     video_grid_thw=[(2, 2, 4), (2, 4, 2)], second_per_grid_ts=[1.0, 0.5], videos_per_sample=[1, 1],
                     load_videos=load_videos)
    u = mb.unpacked()
    assert u.segments is None and u.input_ids.shape == (2, 12)
    np.testing.assert_array_equal(u.video_grid_thw, mb.video_grid_thw)
    np.testing.assert_array_equal(u.second_per_grid_ts, [1.0, 0.5])
    assert u.videos_per_sample == [1, 1] and u.num_video_tokens == mb.num_video_tokens == 8
    np.testing.assert_array_equal(u.pixel_values_videos, mb.pixel_values_videos)
    assert len(calls) == 1
