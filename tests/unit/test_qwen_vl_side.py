"""hyperparallel.models.qwen_vl.side: every side input equals what mindone computes inside the tiny
Qwen2.5-VL / Qwen3-VL models (get_rope_index, create_causal_mask, the loss's label shift, the
masked_scatter of image features, get_window_index + unique_consecutive, rot_pos_emb,
fast_pos_embed_interpolate, cu_seqlens), and the vision towers run from these side inputs give
bit-identical outputs. mindone runs with mindone_cpu applied (its ops need it on CPU); where
mindone's own get_rope_index is wrong on CPU (a text-only sample) the values are hand-computed.
"""
import os
import subprocess
import sys

os.environ.setdefault("GLOG_v", "3")

import numpy as np
import pytest

pytest.importorskip("mindone")

import mindspore as ms  # noqa: E402
from mindspore import Tensor, ops  # noqa: E402

from hyperparallel.models.qwen_vl import cpu as mc  # noqa: E402
from hyperparallel.models.qwen_vl import side  # noqa: E402
from test_mindone_cpu import (IMAGE, VIDEO, VISION_END, VISION_START, make_batch, tensors, tiny_config,  # noqa: E402
                              tiny_model)

KIND = {"25": "qwen2_5_vl", "3": "qwen3_vl"}
GRIDS = [(1, 8, 12), (1, 6, 10), (2, 4, 8), (1, 8, 8)]   # different sizes, odd merged sizes, t = 2
LENS = [(3, 4), (2, 6), (1, 2), (4, 1)]


def _ids(cfg):
    return dict(spatial_merge_size=cfg.vision_config.spatial_merge_size, image_token_id=IMAGE,
                video_token_id=VIDEO, vision_start_token_id=VISION_START)


def _ours(kind, ids, mask, img, vid=None, sec=None):
    cfg = tiny_config(kind)
    opts = side.rope_options(KIND[kind], cfg.vision_config)
    if sec is not None:
        opts["second_per_grid_ts"] = sec
    return side.rope_index(ids, mask, img, vid, **_ids(cfg), **opts)


def _mindone(kind, ids, mask, img, vid=None, sec=None):
    """mindone's own get_rope_index (unpatched method, patched ops)."""
    from mindone.transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
    from mindone.transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel
    fake = type("Fake", (), {"config": tiny_config(kind)})()
    t = lambda a: None if a is None else Tensor(np.asarray(a))  # noqa: E731
    if kind == "25":
        fn = mc.original(Qwen2_5_VLModel, "get_rope_index")
        pos, d = fn(fake, t(ids), t(img), t(vid), t(sec), attention_mask=t(mask))
    else:
        fn = mc.original(Qwen3VLModel, "get_rope_index")
        pos, d = fn(fake, t(ids), t(img), t(vid), attention_mask=t(mask))
    return pos.asnumpy(), d.asnumpy().reshape(-1, 1)


# -- M-RoPE positions --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["25", "3"])
@pytest.mark.parametrize("pad_left", [False, True])
def test_rope_index_equals_mindone_on_image_batches(kind, pad_left):
    b = make_batch(tiny_config(kind), GRIDS, LENS, pad_left=pad_left)
    ours = _ours(kind, b["input_ids"], b["attention_mask"], b["image_grid_thw"])
    ref = _mindone(kind, b["input_ids"], b["attention_mask"], b["image_grid_thw"])
    assert ours[0].dtype == np.int64 and ours[0].shape == (3,) + b["input_ids"].shape
    np.testing.assert_array_equal(ours[0], ref[0])
    np.testing.assert_array_equal(ours[1], ref[1])


def _video(kind):
    """A video of 2 frames of 4 merged tokens each: Qwen2.5-VL one <vision_start> group of 8 tokens;
    Qwen3-VL one group per frame, with timestamp text before each."""
    if kind == "25":
        return [VISION_START] + [VIDEO] * 8 + [VISION_END]
    frame = [VISION_START] + [VIDEO] * 4 + [VISION_END]
    return [20] + frame + [21] + frame


@pytest.mark.parametrize("kind,sec", [("25", None), ("25", [2.0]), ("25", [1.5]), ("25", [0.5]), ("3", None)])
def test_rope_index_equals_mindone_with_videos(kind, sec):
    """Images and videos in one sample and across samples (Qwen2.5: t_idx = frame * int(sec) * tps)."""
    s0 = [12, 13, VISION_START] + [IMAGE] * 4 + [VISION_END, 14] + _video(kind) + [15, 16]
    s1 = [17] + _video(kind)
    n = max(len(s0), len(s1))
    ids = np.zeros((2, n), np.int64)
    mask = np.zeros((2, n), np.int64)
    ids[0, :len(s0)], mask[0, :len(s0)] = s0, 1
    ids[1, n - len(s1):], mask[1, n - len(s1):] = s1, 1
    img = np.array([[1, 4, 4]])
    vid = np.array([[2, 4, 4], [2, 4, 4]])
    secs = None if sec is None else sec * 2
    ours = _ours(kind, ids, mask, img, vid, secs)
    ref = _mindone(kind, ids, mask, img, vid, secs)
    np.testing.assert_array_equal(ours[0], ref[0])
    np.testing.assert_array_equal(ours[1], ref[1])


@pytest.mark.parametrize("kind", ["25", "3"])
def test_rope_index_text_only_sample_next_to_image_sample(kind):
    """mindone's own reduces an empty tensor here (garbage on CPU): expected values by hand."""
    b = make_batch(tiny_config(kind), [(1, 8, 8), None], [(4, 3), (2, 6)])
    pos, deltas = _ours(kind, b["input_ids"], b["attention_mask"], b["image_grid_thw"])
    n = int(b["attention_mask"][1].sum())   # 8 text tokens, then padding
    np.testing.assert_array_equal(pos[:, 1, :n], np.broadcast_to(np.arange(n), (3, n)))
    assert (pos[:, 1, n:] == 1).all()
    # sample 0: 4 text + vision_start (0..4), a 4 x 4 merged grid at offset 5, vision_end + 3 text from 9
    np.testing.assert_array_equal(pos[:, 0, :5], np.broadcast_to(np.arange(5), (3, 5)))
    np.testing.assert_array_equal(pos[0, 0, 5:21], np.full(16, 5))
    np.testing.assert_array_equal(pos[1, 0, 5:21], 5 + np.repeat(np.arange(4), 4))
    np.testing.assert_array_equal(pos[2, 0, 5:21], 5 + np.tile(np.arange(4), 4))
    np.testing.assert_array_equal(pos[:, 0, 21:], np.broadcast_to(np.arange(9, 13), (3, 4)))
    s = b["input_ids"].shape[1]
    np.testing.assert_array_equal(deltas.reshape(-1), [13 - s, n - s])


def test_rope_index_text_only_batches():
    am = np.array([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], np.int64)
    ids = np.where(am == 1, 12, 0)
    ref = np.array([[0, 1, 2, 1, 1], [1, 0, 1, 2, 3]])
    pos, d = side.rope_index(ids, am, **_ids(tiny_config("25")))
    np.testing.assert_array_equal(pos, np.broadcast_to(ref, (3, 2, 5)))
    np.testing.assert_array_equal(d, [[-2], [-1]])
    pos, d = side.rope_index(ids, None, **_ids(tiny_config("25")))
    np.testing.assert_array_equal(pos, np.broadcast_to(np.arange(5), (3, 2, 5)))
    np.testing.assert_array_equal(d, [[0], [0]])


def test_rope_index_errors():
    cfg = tiny_config("25")
    ids = np.array([[12, VISION_START, VIDEO, VIDEO, VISION_END]])
    with pytest.raises(ValueError, match="tokens_per_second"):
        side.rope_index(ids, None, None, np.array([[1, 2, 4]]), **_ids(cfg))
    ids = np.array([[VISION_START, IMAGE, VISION_END, VISION_START, IMAGE, VISION_END]])
    with pytest.raises(ValueError, match="more image groups"):
        side.rope_index(ids, None, np.array([[1, 2, 2]]), None, **_ids(cfg))
    with pytest.raises(ValueError, match="unknown kind"):
        side.rope_options("qwen2_vl", cfg.vision_config)


# -- the LLM's other side inputs ---------------------------------------------------------------

@pytest.mark.parametrize("pad_left", [False, True])
def test_causal_mask_equals_create_causal_mask(pad_left):
    from mindone.transformers.masking_utils import create_causal_mask
    cfg, model = tiny_model("25")
    b = make_batch(cfg, [(1, 8, 8), None, (1, 4, 4)], [(3, 4), (2, 6), (1, 1)], pad_left=pad_left)
    bsz, s = b["input_ids"].shape
    ref = create_causal_mask(config=model.model.language_model.config, input_embeds=ops.zeros((bsz, s, 64), ms.float32),
                             attention_mask=Tensor(b["attention_mask"]), cache_position=Tensor(np.arange(s)),
                             past_key_values=None, position_ids=None)
    got = side.causal_mask(b["attention_mask"])
    assert got.dtype == np.float32 and got.shape == (bsz, 1, s, s)
    np.testing.assert_array_equal(got, ref.asnumpy())


def test_shift_labels_equals_the_loss_shift():
    from mindone.transformers.loss import loss_utils
    labels = make_batch(tiny_config("25"), [(1, 4, 4), None], [(2, 3), (4, 1)])["labels"]
    ref = loss_utils.mint.nn.functional.pad(Tensor(labels), (0, 1), value=-100)[..., 1:]
    np.testing.assert_array_equal(side.shift_labels(labels), ref.asnumpy())
    logits = Tensor(np.random.RandomState(0).randn(*labels.shape, 256).astype(np.float32))
    whole = loss_utils.ForCausalLMLoss(logits, Tensor(labels), 256)
    shifted = loss_utils.ForCausalLMLoss(logits, None, 256, shift_labels=Tensor(side.shift_labels(labels)))
    assert float(whole.asnumpy()) == float(shifted.asnumpy())


def test_image_rows_follow_masked_scatter_order():
    b = make_batch(tiny_config("25"), [(1, 8, 4), None, (1, 4, 8)], [(1, 3), (2, 2), (3, 1)], pad_left=True)
    ids = b["input_ids"]
    rows = side.image_rows(ids, IMAGE)
    n = int((ids == IMAGE).sum())
    assert rows.shape == (ids.size,) and sorted(rows[rows > 0]) == list(range(1, n + 1))
    emb = np.random.RandomState(1).randn(*ids.shape, 6).astype(np.float32)
    feats = np.random.RandomState(2).randn(n, 6).astype(np.float32)
    mask = np.broadcast_to((ids == IMAGE)[..., None], emb.shape).copy()
    ref = Tensor(emb).masked_scatter(Tensor(mask), Tensor(feats)).asnumpy()
    table = np.concatenate([np.zeros((1, 6), np.float32), feats])
    np.testing.assert_array_equal(np.where((rows > 0).reshape(ids.shape)[..., None], table[rows].reshape(emb.shape),
                                           emb), ref)


# -- vision side inputs ------------------------------------------------------------------------

def _grid_tensor():
    return Tensor(np.array(GRIDS, np.int64))


def _mindone_cu_seqlens():
    """The cu_seqlens expression of both towers' construct, with the modules' own (patched) mint / F."""
    from mindone.transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import F, mint
    g = _grid_tensor()
    return F.pad(mint.repeat_interleave(g[:, 1] * g[:, 2], g[:, 0]).cumsum(dim=0, dtype=ms.int32), (1, 0),
                 value=0).asnumpy()


def test_qwen25_vision_side_equals_mindone_helpers():
    cfg, model = tiny_model("25")
    vis, vc = model.model.visual, cfg.vision_config
    got = side.qwen25_vision_side(np.array(GRIDS), vc, inv_freq=vis.rotary_pos_emb.inv_freq.asnumpy())
    widx, cu_w = vis.get_window_index(_grid_tensor())
    from mindspore import mint
    cu_w = mint.unique_consecutive(Tensor(cu_w, ms.int32)).asnumpy()
    assert len(cu_w) < len(vis.get_window_index(_grid_tensor())[1])   # empty windows were dropped
    np.testing.assert_array_equal(got["window_index"], widx.asnumpy())
    np.testing.assert_array_equal(got["reverse_index"], np.argsort(widx.asnumpy()))
    np.testing.assert_array_equal(got["cu_window_seqlens"], cu_w)
    assert got["cu_window_seqlens"].dtype == np.int32 and got["cu_seqlens"].dtype == np.int32
    np.testing.assert_array_equal(got["cu_seqlens"], [0, 96, 156, 188, 220, 284])
    np.testing.assert_array_equal(got["cu_seqlens"], _mindone_cu_seqlens())
    rot = vis.rot_pos_emb(_grid_tensor()).asnumpy()
    rot = rot.reshape(-1, 4, rot.shape[1])[got["window_index"]].reshape(rot.shape)
    np.testing.assert_array_equal(got["angles"], rot)   # bitwise
    default = side.qwen25_vision_side(np.array(GRIDS), vc)   # numpy inv_freq: bit-equal at this head size
    np.testing.assert_array_equal(default["angles"], got["angles"])


def test_qwen25_vision_tower_from_side_inputs_is_bit_exact():
    cfg, model = tiny_model("25")
    vis, vc = model.model.visual, cfg.vision_config
    b = make_batch(cfg, GRIDS, LENS)
    s = side.qwen25_vision_side(b["image_grid_thw"], vc, inv_freq=vis.rotary_pos_emb.inv_freq.asnumpy())
    pe = mc.vision_cos_sin(s["angles"])
    h = vis.patch_embed(Tensor(b["pixel_values"]))
    n = h.shape[0]
    h = h.reshape(n // 4, 4, -1)[Tensor(s["window_index"])].reshape(n, -1)
    for i, blk in enumerate(vis.blocks):
        cu = s["cu_seqlens"] if i in vc.fullatt_block_indexes else s["cu_window_seqlens"]
        h = blk(h, cu_seqlens=Tensor(cu), position_embeddings=pe)
    h = vis.merger(h)[Tensor(s["reverse_index"])]
    ref = vis(Tensor(b["pixel_values"]), grid_thw=Tensor(b["image_grid_thw"]))
    np.testing.assert_array_equal(h.asnumpy(), ref.asnumpy())


def test_qwen3_vision_side_equals_mindone_helpers():
    cfg, model = tiny_model("3")
    vis, vc = model.model.visual, cfg.vision_config
    got = side.qwen3_vision_side(np.array(GRIDS), vc, inv_freq=vis.rotary_pos_emb.inv_freq.asnumpy())
    np.testing.assert_array_equal(got["cu_seqlens"], _mindone_cu_seqlens())
    np.testing.assert_array_equal(got["angles"], vis.rot_pos_emb(_grid_tensor()).asnumpy())
    assert got["pos_idx"].shape == got["pos_wts"].shape == (4, 284) and got["pos_wts"].dtype == np.float32
    p = vis.pos_embed(Tensor(got["pos_idx"])) * Tensor(got["pos_wts"])[:, :, None]
    np.testing.assert_array_equal((p[0] + p[1] + p[2] + p[3]).asnumpy(),
                                  vis.fast_pos_embed_interpolate(_grid_tensor()).asnumpy())


def test_qwen3_vision_tower_from_side_inputs_is_bit_exact():
    cfg, model = tiny_model("3")
    vis, vc = model.model.visual, cfg.vision_config
    b = make_batch(cfg, GRIDS, LENS)
    s = side.qwen3_vision_side(b["image_grid_thw"], vc, inv_freq=vis.rotary_pos_emb.inv_freq.asnumpy())
    pe, cu = mc.vision_cos_sin(s["angles"]), Tensor(s["cu_seqlens"])
    p = vis.pos_embed(Tensor(s["pos_idx"])) * Tensor(s["pos_wts"])[:, :, None]
    h = vis.patch_embed(Tensor(b["pixel_values"])) + (p[0] + p[1] + p[2] + p[3])
    ds = []
    for i, blk in enumerate(vis.blocks):
        h = blk(h, cu_seqlens=cu, position_embeddings=pe)
        if i in vc.deepstack_visual_indexes:
            ds.append(vis.deepstack_merger_list[vc.deepstack_visual_indexes.index(i)](h))
    ref, ref_ds = vis(Tensor(b["pixel_values"]), grid_thw=Tensor(b["image_grid_thw"]))
    np.testing.assert_array_equal(vis.merger(h).asnumpy(), ref.asnumpy())
    for a, r in zip(ds, ref_ds):
        np.testing.assert_array_equal(a.asnumpy(), r.asnumpy())


@pytest.mark.parametrize("kind", ["25", "3"])
def test_whole_llm_from_side_inputs_is_bit_exact(kind):
    """The loss of the model as users call it, recomputed from the side inputs: embeddings with the
    image rows, the layers with the side mask and positions (Qwen3: deepstack), the shifted loss."""
    cfg, model = tiny_model(kind)
    b = make_batch(cfg, [(1, 8, 12), None, (1, 4, 4)], [(3, 4), (2, 6), (1, 1)], pad_left=True)
    ref = model(**tensors(b)).loss
    pos, _ = side.rope_index(b["input_ids"], b["attention_mask"], b["image_grid_thw"], None, **_ids(cfg),
                             **side.rope_options(KIND[kind], cfg.vision_config))
    loss = _llm_loss(kind, cfg, model, b["input_ids"], b["labels"], pos, side.causal_mask(b["attention_mask"]),
                     b["pixel_values"], b["image_grid_thw"])
    assert loss == float(ref.asnumpy())


def _pack(b, rows, seq_len):
    """The samples of make_batch's ``b`` packed into ``rows`` (lists of sample indices, in order): (ids, labels,
    segment lengths, grids in packed order); a sample's first label -100, padding 0."""
    lens = b["attention_mask"].sum(1)
    ids, labels = np.zeros((len(rows), seq_len), np.int64), np.full((len(rows), seq_len), -100, np.int64)
    for r, row in enumerate(rows):
        off = 0
        for k in row:
            n = int(lens[k])
            ids[r, off:off + n], labels[r, off:off + n] = b["input_ids"][k, :n], b["labels"][k, :n]
            labels[r, off] = -100
            off += n
    return ids, labels, [[int(lens[k]) for k in row] for row in rows]


def _llm_loss(kind, cfg, model, ids, labels, pos, mask, pixel_values, grid):
    """The LLM of ``model`` run from side inputs (as the chunks run it): the mean loss over the labels."""
    lm, inner = model.model.language_model, model.model
    vis_out = inner.visual(Tensor(pixel_values), grid_thw=Tensor(grid))
    feats, ds = (vis_out, []) if kind == "25" else vis_out
    rows = side.image_rows(ids, IMAGE)
    bsz, s = ids.shape
    h = lm.embed_tokens(Tensor(ids))
    table = ops.concat((ops.zeros((1, 64), ms.float32), feats), axis=0)
    h = ops.where(Tensor((rows > 0).reshape(bsz, s, 1)), ops.gather(table, Tensor(rows), 0).reshape(bsz, s, 64), h)
    pos_t, mask = Tensor(pos), Tensor(mask)
    pe = lm.rotary_emb(h, pos_t)
    for i, layer in enumerate(lm.layers):
        if kind == "25":
            h = layer(h, attention_mask=mask, position_ids=pos_t[0], position_embeddings=pe)[0]
        else:
            h = layer(h, attention_mask=mask, position_ids=pos_t[0], past_key_values=None,
                      cache_position=Tensor(np.arange(s)), position_embeddings=pe)
            if i < len(ds):
                h = lm._deepstack_process(h, Tensor((rows > 0).reshape(bsz, s)), ds[i])
    logits = model.lm_head(lm.norm(h)).float()
    return float(mc.cross_entropy(logits.reshape(-1, 256), Tensor(side.shift_labels(labels).reshape(-1))).asnumpy())


@pytest.mark.parametrize("kind", ["25", "3"])
def test_packed_rows_give_the_loss_of_the_samples_unpacked(kind):
    """data.packing: three samples (two with images of different sizes, one text-only) packed two into one row,
    one into another, run through mindone's layers with the block-diagonal mask and per-sample M-RoPE positions:
    the loss (mean over the same answer tokens) equals the model's called on the samples unpacked, as users call
    it. With one causal mask over the whole row (attention across samples) it does not."""
    cfg, model = tiny_model(kind)
    b = make_batch(cfg, [(1, 8, 12), None, (1, 4, 4)], [(3, 4), (2, 6), (1, 1)])
    ref = float(model(**tensors(b)).loss.asnumpy())
    S = 64
    ids, labels, segs = _pack(b, [[0, 1], [2]], S)
    seg = np.zeros(ids.shape, np.int64)
    for r, row in enumerate(segs):
        seg[r, :sum(row)] = np.repeat(np.arange(1, len(row) + 1), row)
    pos_u, _ = side.rope_index(b["input_ids"], b["attention_mask"], b["image_grid_thw"], None, **_ids(cfg),
                               **side.rope_options(KIND[kind], cfg.vision_config))
    pos = side.pack_positions(pos_u, segs, S)
    args = (kind, cfg, model, ids, labels)
    vis = (b["pixel_values"], b["image_grid_thw"])
    got = _llm_loss(*args, pos, side.packed_causal_mask(seg), *vis)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    crossing = _llm_loss(*args, pos, side.causal_mask(seg > 0), *vis)
    assert abs(crossing - ref) > 1e-4 * abs(ref), (crossing, ref)
    # the positions are each sample's own (RoPE is relative, so within a sample's block positions shifted by a
    # constant would give the same scores: the restart is checked on the positions themselves)
    a, n = segs[0]
    np.testing.assert_array_equal(pos[:, 0, a:a + n], np.broadcast_to(np.arange(n), (3, n)))   # text-only: 0..
    np.testing.assert_array_equal(pos[:, 0, :a], pos_u[:, 0, :a])
    np.testing.assert_array_equal(pos[:, 1, :segs[1][0]], pos_u[:, 2, :segs[1][0]])


# -- pure numpy --------------------------------------------------------------------------------

def test_packed_causal_mask_is_each_samples_causal_mask_on_its_block():
    """Block b of a packed row's mask is :func:`side.causal_mask` of sample b alone (checked against mindone's
    create_causal_mask above); every key outside the block is masked; padding queries attend as unpacked."""
    segs = [[3, 5, 2], [7], [4, 4]]
    S = 12
    seg = np.zeros((len(segs), S), np.int64)
    for r, row in enumerate(segs):
        seg[r, :sum(row)] = np.repeat(np.arange(1, len(row) + 1), row)
    m = side.packed_causal_mask(seg)
    lo = np.finfo(np.float32).min
    assert m.shape == (3, 1, S, S) and m.dtype == np.float32
    for r, row in enumerate(segs):
        off = 0
        for n in row:
            block = m[r, 0, off:off + n, off:off + n]
            np.testing.assert_array_equal(block, side.causal_mask(np.ones((1, n)))[0, 0])
            outside = np.delete(m[r, 0, off:off + n], np.s_[off:off + n], axis=1)
            assert (outside == lo).all()
            off += n
        np.testing.assert_array_equal(m[r, 0, off:], side.causal_mask((seg[r:r + 1] > 0))[0, 0, off:])
    # unpacked rows (one sample each): the causal mask
    one = (np.arange(S)[None] < np.array([[5], [12]])).astype(np.int64)
    np.testing.assert_array_equal(side.packed_causal_mask(one), side.causal_mask(one))


def test_pack_positions_restart_at_each_sample():
    up = np.arange(3 * 3 * 6).reshape(3, 3, 6) + 10
    got = side.pack_positions(up, [[2, 3], [4]], 8)
    np.testing.assert_array_equal(got[:, 0, :5], np.concatenate([up[:, 0, :2], up[:, 1, :3]], 1))
    np.testing.assert_array_equal(got[:, 1, :4], up[:, 2, :4])
    assert (got[:, 0, 5:] == 1).all() and (got[:, 1, 4:] == 1).all()


def test_torch_linspace():
    np.testing.assert_array_equal(side.torch_linspace(0, 7, 5), np.array([0, 1.75, 3.5, 5.25, 7], np.float32))
    assert side.torch_linspace(2, 5, 1).tolist() == [2.0] and side.torch_linspace(0, 1, 0).shape == (0,)
    out = side.torch_linspace(0, 7, 12)
    assert out.dtype == np.float32 and out[0] == 0 and out[-1] == 7


def test_importable_without_mindspore():
    code = ("import sys; sys.modules['mindspore'] = None; import hyperparallel.models.qwen_vl.side as s; "
            "print(s.rope_index([[12, 13]], [[1, 1]], spatial_merge_size=2, image_token_id=10, video_token_id=11, "
            "vision_start_token_id=8)[0].tolist())")
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[[[0, 1]], [[0, 1]], [[0, 1]]]"
