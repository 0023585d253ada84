"""Side inputs of the Qwen2.5-VL / Qwen3-VL chunks, in numpy, from ``input_ids``, ``attention_mask``,
``labels`` and ``image_grid_thw`` alone (no pixels, no model, no MindSpore).

mindone 0.5.0 computes these inside the whole model's ``construct``; a pipeline chunk holds only some
layers, so each chunk is handed them instead. Every function names the mindone code it reproduces
(``tests/unit/test_qwen_vl_side.py`` checks each against it on tiny models).

Notation: ``grid_thw`` (n, 3) in patches per image (or video); N = sum t*h*w patches;
m = ``spatial_merge_size``, u = m*m; M = N / u merged tokens (= image tokens in ``input_ids``).

Bit-exactness of the vision rotary tables: the functions return the rotary *angles*, not cos/sin,
because numpy's float32 cos/sin differ from MindSpore's by an ulp. Turn them into the towers'
``(cos, sin)`` with MindSpore (``mindone_cpu.vision_cos_sin``). The angles are bit-equal to
mindone's ``rot_pos_emb`` when ``inv_freq`` is the model's buffer
(``visual.rotary_pos_emb.inv_freq``); the numpy default is bit-equal for the tiny head sizes but
differs by up to 1 ulp for real ones (vision head_dim 80 / 72).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["rope_index", "rope_options", "causal_mask", "packed_causal_mask", "pack_positions", "shift_labels", "image_rows", "vision_cu_seqlens",
           "vision_angles", "qwen25_window_index", "qwen25_vision_side", "torch_linspace", "qwen3_pos_interp",
           "qwen3_vision_side"]


def _cfg(cfg, name):
    return cfg[name] if isinstance(cfg, dict) else getattr(cfg, name)


def _grids(grid_thw):
    return [] if grid_thw is None else [tuple(int(v) for v in g) for g in np.asarray(grid_thw).reshape(-1, 3)]


# -- LLM side inputs ---------------------------------------------------------------------------

def rope_options(kind: str, vision_config) -> dict:
    """The model-specific keywords of :func:`rope_index` for ``kind`` 'qwen2_5_vl' or 'qwen3_vl'."""
    if kind == "qwen2_5_vl":
        return dict(tokens_per_second=_cfg(vision_config, "tokens_per_second"), per_frame_video=False)
    if kind == "qwen3_vl":
        return dict(per_frame_video=True)
    raise ValueError(f"rope_options: unknown kind {kind!r} (expected 'qwen2_5_vl' or 'qwen3_vl')")


def rope_index(input_ids, attention_mask=None, image_grid_thw=None, video_grid_thw=None, *,
               spatial_merge_size: int, image_token_id: int, video_token_id: int, vision_start_token_id: int,
               tokens_per_second: Optional[float] = None, second_per_grid_ts=None, per_frame_video: bool = False):
    """M-RoPE ``position_ids`` (3, B, S) int64 and ``deltas`` (B, 1) int64 (= max position + 1 - S).

    Reproduces mindone's ``Qwen2_5_VLModel.get_rope_index`` (``per_frame_video=False``) and
    ``Qwen3VLModel.get_rope_index`` (``per_frame_video=True``), rule for rule:

    * no grids at all: 1-D positions ``cumsum(mask) - 1``, padding 1 (without a mask: ``arange(S)``,
      deltas 0);
    * otherwise per sample, over its non-padding tokens: a vision group is the token after a
      ``vision_start`` (image or video token); images and videos take grid rows in order across the
      batch; text runs get the same position on the 3 axes, continuing from max(previous) + 1; a group
      of (t, h/m, w/m) merged tokens gets (t_idx, h_idx, w_idx) + its text offset; padding is 1.
      A sample without vision tokens gets plain 1-D positions (mindone's own code reduces an empty
      tensor there, which is garbage on CPU; see ``mindone_cpu``);
    * t_idx of images: Qwen2.5-VL 0; Qwen3-VL ``arange(t)``;
    * videos, Qwen2.5-VL: t_idx = frame * int(second_per_grid_t) * tokens_per_second (truncated, as
      mindone and HF: ``second_per_grid_ts`` is cast to int64 first; default 1.0 per video);
    * videos, Qwen3-VL: every frame is its own ``vision_start`` group with t = 1 (timestamps are text
      tokens between the frames), so ``video_grid_thw`` rows are split per frame and t_idx is 0.
    """
    ids = np.asarray(input_ids)
    b, s = ids.shape
    imgs, vids = _grids(image_grid_thw), _grids(video_grid_thw)
    if image_grid_thw is None and video_grid_thw is None:
        if attention_mask is None:
            return np.broadcast_to(np.arange(s), (3, b, s)).astype(np.int64), np.zeros((b, 1), np.int64)
        am = np.asarray(attention_mask).astype(np.int64)
        pos = am.cumsum(-1) - 1
        pos[am == 0] = 1
        return np.broadcast_to(pos, (3, b, s)).astype(np.int64), pos.max(-1, keepdims=True) + 1 - s
    keep_all = np.ones((b, s), bool) if attention_mask is None else np.asarray(attention_mask) == 1
    secs = [1.0] * len(vids) if second_per_grid_ts is None else [float(v) for v in np.ravel(second_per_grid_ts)]
    if per_frame_video:
        vids, secs = [(1, h, w) for t, h, w in vids for _ in range(t)], None
    elif vids and tokens_per_second is None:
        raise ValueError("rope_index: Qwen2.5-VL videos need tokens_per_second (vision_config.tokens_per_second)")
    m = spatial_merge_size
    pos = np.ones((3, b, s), np.int64)
    deltas = np.zeros((b, 1), np.int64)
    ii = vi = 0
    for i in range(b):
        tok = ids[i][keep_all[i]].tolist()
        after = [tok[k + 1] for k, x in enumerate(tok[:-1]) if x == vision_start_token_id]
        left_i, left_v = after.count(image_token_id), after.count(video_token_id)
        parts, st = [], 0
        for _ in range(left_i + left_v):
            ed_i = tok.index(image_token_id, st) if left_i > 0 and image_token_id in tok else len(tok) + 1
            ed_v = tok.index(video_token_id, st) if left_v > 0 and video_token_id in tok else len(tok) + 1
            table, k = (imgs, ii) if ed_i < ed_v else (vids, vi)
            if k >= len(table):
                raise ValueError(f"rope_index: sample {i} has more {'image' if ed_i < ed_v else 'video'} groups "
                                 f"than grid rows ({len(table)})")
            t, h, w = table[k]
            if ed_i < ed_v:
                ed, ii, left_i = ed_i, ii + 1, left_i - 1
                t_idx = np.arange(t) if per_frame_video else np.zeros(t, np.int64)
            else:
                ed, vi, left_v = ed_v, vi + 1, left_v - 1
                t_idx = np.arange(t) if per_frame_video else \
                    (np.arange(t) * int(secs[k]) * tokens_per_second).astype(np.int64)
            gh, gw = h // m, w // m
            start = int(parts[-1].max()) + 1 if parts else 0
            parts.append(np.broadcast_to(np.arange(ed - st), (3, ed - st)) + start)
            grid = np.stack([np.repeat(t_idx, gh * gw), np.tile(np.repeat(np.arange(gh), gw), t),
                             np.tile(np.arange(gw), t * gh)])
            parts.append(grid + (ed - st) + start)
            st = ed + t * gh * gw
        if st < len(tok):
            start = int(parts[-1].max()) + 1 if parts else 0
            parts.append(np.broadcast_to(np.arange(len(tok) - st), (3, len(tok) - st)) + start)
        llm = np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), np.int64)
        if llm.shape[1] != len(tok):
            raise ValueError(f"rope_index: sample {i}'s vision groups cover {llm.shape[1]} positions but it has "
                             f"{len(tok)} tokens (grid rows do not match its vision tokens)")
        pos[:, i, keep_all[i]] = llm
        deltas[i, 0] = (int(llm.max()) + 1 if llm.size else 0) - s
    return pos, deltas


def causal_mask(attention_mask) -> np.ndarray:
    """Additive (B, 1, S, S) float32 mask: 0 where key j <= query i and key j is not padding, float32 min
    elsewhere. Reproduces mindone's ``masking_utils.create_causal_mask`` (eager attention)."""
    am = np.asarray(attention_mask).astype(bool)
    s = am.shape[1]
    allowed = np.tril(np.ones((s, s), bool))[None] & am[:, None, :]
    return np.where(allowed, np.float32(0), np.finfo(np.float32).min).astype(np.float32)[:, None]


def packed_causal_mask(segment_ids) -> np.ndarray:
    """Additive (B, 1, S, S) float32 mask of packed rows (``data.packing``): query i of sample k attends to
    keys j <= i of the same sample only (block-diagonal causal); ``segment_ids`` (B, S): 1, 2, ... per sample,
    0 on padding, whose queries attend as in :func:`causal_mask` (to every earlier real key; they score
    nothing). Each sample's block is :func:`causal_mask` of that sample alone."""
    seg = np.asarray(segment_ids)
    s = seg.shape[1]
    real = seg > 0
    same = (seg[:, :, None] == seg[:, None, :]) | ~real[:, :, None]
    allowed = np.tril(np.ones((s, s), bool))[None] & real[:, None, :] & same
    return np.where(allowed, np.float32(0), np.finfo(np.float32).min).astype(np.float32)[:, None]


def pack_positions(unpacked_pos, segments, seq_len: int) -> np.ndarray:
    """(3, B, S) M-RoPE positions of packed rows from :func:`rope_index` of the same samples one per row
    (``unpacked_pos`` (3, n, S), samples in packed order): each sample's positions restart where it starts
    in its row; padding 1 (as :func:`rope_index` gives it)."""
    up = np.asarray(unpacked_pos)
    out = np.ones((3, len(segments), int(seq_len)), np.int64)
    k = 0
    for b, row in enumerate(segments):
        off = 0
        for n in row:
            out[:, b, off:off + n] = up[:, k, :n]
            off, k = off + n, k + 1
    return out


def shift_labels(labels, ignore_index: int = -100) -> np.ndarray:
    """(B, S) targets: position i is scored against ``labels[:, i + 1]``, the last position is ignored.
    Reproduces the shift in mindone's ``loss_utils.ForCausalLMLoss``."""
    lab = np.asarray(labels)
    return np.concatenate([lab[:, 1:], np.full((lab.shape[0], 1), ignore_index, lab.dtype)], 1)


def image_rows(input_ids, image_token_id: int) -> np.ndarray:
    """(B*S,) int64 row map for scattering merged vision features into the embeddings: 0 for other
    tokens, k+1 for the k-th ``image_token_id`` token in (sample, position) order, the order of
    mindone's ``inputs_embeds.masked_scatter(image_mask, image_embeds)`` (pass ``video_token_id`` for
    video features). Use ``gather(cat(zeros(1, D), feats), rows)``; ``rows > 0`` is Qwen3-VL's
    ``visual_pos_masks`` for a batch without videos."""
    hit = (np.asarray(input_ids) == image_token_id).reshape(-1)
    rows = np.zeros(hit.shape[0], np.int64)
    rows[hit] = np.arange(1, int(hit.sum()) + 1)
    return rows


# -- vision side inputs, both models -----------------------------------------------------------

def vision_cu_seqlens(grid_thw) -> np.ndarray:
    """Per-frame attention boundaries ``[0, cumsum(repeat(h*w, t))]`` int32. Reproduces ``cu_seqlens`` in
    mindone's ``Qwen2_5_VisionTransformerPretrainedModel.construct`` / ``Qwen3VLVisionModel.construct``."""
    g = np.asarray(grid_thw, np.int64).reshape(-1, 3)
    return np.concatenate([[0], np.cumsum(np.repeat(g[:, 1] * g[:, 2], g[:, 0]))]).astype(np.int32)


def _patch_rows_cols(grid_thw, m: int) -> np.ndarray:
    """(N, 2) (row, col) of every patch in the processor's order (m x m merge blocks contiguous)."""
    out = []
    for t, h, w in _grids(grid_thw):
        rows = np.broadcast_to(np.arange(h)[:, None], (h, w)).reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3)
        cols = np.broadcast_to(np.arange(w)[None], (h, w)).reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3)
        out.append(np.tile(np.stack([rows.reshape(-1), cols.reshape(-1)], -1), (t, 1)))
    return np.concatenate(out, 0)


def vision_angles(grid_thw, m: int, head_dim: int, inv_freq=None, theta: float = 10000.0) -> np.ndarray:
    """(N, head_dim/2) float32 rotary angles ``cat(row * inv_freq, col * inv_freq)`` per patch, patch order.
    Reproduces mindone's ``rot_pos_emb`` (both towers). ``inv_freq``: pass the model's
    ``visual.rotary_pos_emb.inv_freq`` for bit-exactness (module docstring)."""
    dim = head_dim // 2
    if inv_freq is None:
        inv_freq = np.float32(1) / np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    inv_freq = np.asarray(inv_freq, np.float32)
    rc = _patch_rows_cols(grid_thw, m)
    table = np.arange(int(rc.max()) + 1, dtype=np.float32)[:, None] * inv_freq[None]
    return table[rc].reshape(rc.shape[0], -1)


# -- Qwen2.5-VL vision -------------------------------------------------------------------------

def qwen25_window_index(grid_thw, window_size: int, patch_size: int, m: int):
    """(window_index (M,) int64, cu_window_seqlens int32). Windows of ``window_size // m // patch_size``
    squared merged tokens, tiled from each frame's top-left; ``cu_window_seqlens`` counts patches,
    with empty windows dropped. Reproduces mindone's ``get_window_index`` followed by the
    ``mint.unique_consecutive`` in ``Qwen2_5_VisionTransformerPretrainedModel.construct``."""
    vw = window_size // m // patch_size
    index, cu, off = [], [0], 0
    for t, h, w in _grids(grid_thw):
        gh, gw = h // m, w // m
        ph, pw = vw - gh % vw, vw - gw % vw   # a whole empty window when divisible, as mindone
        nh, nw = (gh + ph) // vw, (gw + pw) // vw
        padded = np.full((t, gh + ph, gw + pw), -100, np.int64)
        padded[:, :gh, :gw] = np.arange(t * gh * gw).reshape(t, gh, gw)
        padded = padded.reshape(t, nh, vw, nw, vw).transpose(0, 1, 3, 2, 4).reshape(-1, vw * vw)
        flat = padded.reshape(-1)
        index.append(flat[flat != -100] + off)
        cu.extend((np.cumsum((padded != -100).sum(1)) * m * m + cu[-1]).tolist())
        off += t * gh * gw
    cu = np.asarray(cu, np.int64)
    cu = cu[np.concatenate([[True], cu[1:] != cu[:-1]])]
    return np.concatenate(index), cu.astype(np.int32)


def qwen25_vision_side(grid_thw, vision_config, inv_freq=None) -> dict:
    """What the Qwen2.5-VL vision chunks need besides the hidden state, from the grid alone:

    * ``window_index`` (M,) int64: reorder groups of u patches into windows before block 0;
    * ``reverse_index`` (M,) int64: ``argsort(window_index)``, applied after the merger;
    * ``cu_window_seqlens`` int32: for the blocks NOT in ``fullatt_block_indexes``;
    * ``cu_seqlens`` int32: for the blocks in ``fullatt_block_indexes`` (per frame);
    * ``angles`` (N, head_dim/2) float32: rotary angles already in window order (cos/sin: module docstring).

    Reproduces ``get_window_index``, ``rot_pos_emb`` and the reorders of
    ``Qwen2_5_VisionTransformerPretrainedModel.construct``."""
    m = _cfg(vision_config, "spatial_merge_size")
    u = m * m
    widx, cu_w = qwen25_window_index(grid_thw, _cfg(vision_config, "window_size"),
                                     _cfg(vision_config, "patch_size"), m)
    ang = vision_angles(grid_thw, m, _cfg(vision_config, "hidden_size") // _cfg(vision_config, "num_heads"), inv_freq)
    ang = ang.reshape(-1, u, ang.shape[1])[widx].reshape(ang.shape)
    return dict(window_index=widx, reverse_index=np.argsort(widx, kind="stable"), cu_window_seqlens=cu_w,
                cu_seqlens=vision_cu_seqlens(grid_thw), angles=ang)


# -- Qwen3-VL vision ---------------------------------------------------------------------------

def torch_linspace(start: float, end: float, steps: int) -> np.ndarray:
    """float32 linspace as torch computes it (and ``mindone_cpu``'s ``mint.linspace``): step =
    (end - start) / (steps - 1) in float32, ``start + i*step`` for i < steps // 2, else
    ``end - (steps - 1 - i)*step``. numpy's float64 linspace differs in the last bit."""
    if steps <= 1:
        return np.full(max(steps, 0), start, np.float32)
    s, e = np.float32(start), np.float32(end)
    step = (e - s) / np.float32(steps - 1)
    i = np.arange(steps, dtype=np.float32)
    return np.where(np.arange(steps) < steps // 2, s + i * step, e - (np.float32(steps - 1) - i) * step
                    ).astype(np.float32)


def qwen3_pos_interp(grid_thw, num_grid_per_side: int, m: int):
    """(pos_idx (4, N) int64, pos_wts (4, N) float32): bilinear interpolation of the learned G x G
    position table to each frame's (h, w) grid, already in patch (merge-block) order and repeated
    over t. ``sum(pos_embed(pos_idx) * pos_wts[:, :, None])`` summed k = 0, 1, 2, 3 in that order is
    bit-equal to mindone's ``Qwen3VLVisionModel.fast_pos_embed_interpolate``."""
    G = num_grid_per_side
    idx, wts = [], []
    for t, h, w in _grids(grid_thw):
        hi, wi = torch_linspace(0, G - 1, h), torch_linspace(0, G - 1, w)
        hf, wf = hi.astype(np.int32), wi.astype(np.int32)
        hc, wc = np.minimum(hf + 1, G - 1), np.minimum(wf + 1, G - 1)
        dh, dw = (hi - hf).astype(np.float32), (wi - wf).astype(np.float32)
        one = np.float32(1)
        i4 = [hf[:, None] * G + wf, hf[:, None] * G + wc, hc[:, None] * G + wf, hc[:, None] * G + wc]
        w4 = [(one - dh)[:, None] * (one - dw), (one - dh)[:, None] * dw, dh[:, None] * (one - dw), dh[:, None] * dw]
        perm = np.arange(h * w).reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).reshape(-1)
        idx.append(np.stack([np.tile(a.reshape(-1)[perm], t) for a in i4]))
        wts.append(np.stack([np.tile(a.reshape(-1)[perm], t) for a in w4]))
    return np.concatenate(idx, 1).astype(np.int64), np.concatenate(wts, 1).astype(np.float32)


def qwen3_vision_side(grid_thw, vision_config, inv_freq=None) -> dict:
    """What the Qwen3-VL vision chunks need besides the hidden state, from the grid alone:

    * ``cu_seqlens`` int32: every block (per frame; Qwen3-VL has no windows);
    * ``angles`` (N, head_dim/2) float32: rotary angles in patch order (cos/sin: module docstring);
    * ``pos_idx`` (4, N) int64, ``pos_wts`` (4, N) float32: the first chunk adds
      ``p = pos_embed(pos_idx) * pos_wts[:, :, None]; p[0] + p[1] + p[2] + p[3]`` to the patch
      embeddings (cast ``pos_wts`` to the table's dtype).

    Reproduces ``rot_pos_emb``, ``fast_pos_embed_interpolate`` and ``cu_seqlens`` of
    ``Qwen3VLVisionModel.construct``."""
    m = _cfg(vision_config, "spatial_merge_size")
    head_dim = _cfg(vision_config, "hidden_size") // _cfg(vision_config, "num_heads")
    pos_idx, pos_wts = qwen3_pos_interp(grid_thw, int(_cfg(vision_config, "num_position_embeddings") ** 0.5), m)
    return dict(cu_seqlens=vision_cu_seqlens(grid_thw), angles=vision_angles(grid_thw, m, head_dim, inv_freq),
                pos_idx=pos_idx, pos_wts=pos_wts)
