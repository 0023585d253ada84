"""MindSpore side of :mod:`.adapter`: mindone's whole Qwen2.5-VL / Qwen3-VL model, its chunks, the
micro-batch's side inputs as tensors, and the model as users call it (the reference).

Chunks are made of the network's own cells (shared, not copied), so parameter names stay the
model's (``model.visual.blocks.0.attn.qkv.weight``, ``model.language_model.layers.3...``,
``lm_head.weight``) and any cut of the layers runs exactly what the whole model runs: the pieces
of ``Qwen2_5_VisionTransformerPretrainedModel.construct``, ``Qwen3VLVisionModel.construct`` and the
language models' ``construct`` in their order, with the side inputs they compute inside (window
index, cu_seqlens, rotary tables, M-RoPE positions, the causal mask, the scatter of the image
features) computed on the host from the micro-batch's token ids and grids
(:mod:`.side`).
"""
from __future__ import annotations

import copy
from typing import Dict

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from ...errors import SpecError
from . import graph, side


# -- the network -------------------------------------------------------------------------------

def build_network(adapter):
    """The whole mindone model of ``adapter`` (CPU compatibility applied first on CPU), its weights
    from ``adapter.pretrained`` when given."""
    from . import cpu as mindone_cpu
    mindone_cpu.apply()   # no-op off CPU; must precede building (mindone creates Parameters with mint ops)
    import mindone.transformers as mt
    cfg = copy.deepcopy(adapter.cfg)
    attn = adapter.fields.get("attn_implementation") or "eager"
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = attn
    ms.set_seed(adapter.seed)
    np.random.seed(adapter.seed)
    net = getattr(mt, adapter.arch)(cfg)
    if adapter.pretrained:
        load_hf_weights(net, adapter.pretrained, adapter.checkpoint_name)
    if adapter.lora is not None:   # PEFT's adapters on the whole model, before any cut (:mod:`.lora`)
        from ..lora import inject
        adapter.peft = inject(net, adapter.lora)
    return with_precision(net, adapter.precision()[0])


def with_precision(net, dtype: str):
    """``net`` computing in ``dtype`` with its Parameters kept float32 (the master weights): MindSpore's own
    mixed precision, ``mindspore.amp.auto_mixed_precision(net, "O2", dtype)``, which sets every cell's
    ``to_float`` in place (its float inputs and weights are cast at use, so the tape's gradients reach the
    float32 Parameters; MindSpore's black-list cells, its norms, stay float32). float32: ``net`` unchanged.
    The wrapper it returns (output cast to float32) is not used: chunks call the network's cells."""
    if dtype == "float32":
        return net
    from mindspore import amp
    amp.auto_mixed_precision(net, "O2", dtype=getattr(ms, dtype))
    return net


def load_hf_weights(net, path: str, rename) -> None:
    """Every parameter of ``net`` from the directory's safetensors files, by name (either spelling)."""
    values = {}
    from ..hf_dir import weight_files
    for f in weight_files(path):
        for name, v in ms.load_checkpoint(f, format="safetensors").items():
            values[rename(name)] = v
    params = {p.name: p for p in net.get_parameters()}
    missing = sorted(set(params) - set(values))
    extra = sorted(set(values) - set(params))
    wrong = sorted(n for n in set(params) & set(values) if tuple(params[n].shape) != tuple(values[n].shape))
    if missing or extra or wrong:
        what = [f"missing {missing[:3]}" if missing else "", f"unknown {extra[:3]}" if extra else "",
                f"wrong shapes {wrong[:3]}" if wrong else ""]
        raise SpecError("model.pretrained", f"{path} does not fit the config: " + "; ".join(w for w in what if w))
    ms.load_param_into_net(net, {n: values[n] for n in params}, strict_load=True)


class _Slice(nn.Cell):
    """A chunk of the network: its cells registered under their own names, parameter names kept."""

    # the tensor-only body (``graph_args`` / ``graph_body``) computes ``forward`` with the graph-ready layer
    # forwards of :mod:`.graph` on the same cells; where it cannot (tensor parallelism, LoRA, a compute dtype
    # other than float32) the adapter says why the chunks run eager (``QwenVL.compile_reason``)

    def __init__(self, net):
        super().__init__(auto_prefix=False)
        self._names = {id(p): p.name for p in net.get_parameters()}   # before attaching renames them

    def _named(self, net) -> None:
        for p in self.get_parameters():   # attaching prefixed them: restore the model's names
            p.name = self._names[id(p)]


# -- side inputs -------------------------------------------------------------------------------

def _t(a) -> Tensor:
    return Tensor(np.ascontiguousarray(a))


class QwenTensors:
    """A :class:`~.batch.QwenVLBatch` as the tensors every chunk reads, plus the loss
    scale. Vision side inputs and pixels are built when first read (ranks without the encoder never
    build them)."""

    def __init__(self, adapter, mb, loss_scale: float):
        self.adapter, self.batch, self.loss_scale = adapter, mb, float(loss_scale)
        cfg, v = adapter.cfg, adapter.vision
        ids, am = np.asarray(mb.input_ids, np.int64), np.asarray(mb.attention_mask, np.int64)
        B, S = ids.shape
        grid = np.asarray(mb.image_grid_thw, np.int64).reshape(-1, 3)
        self.real_grid = grid[:len(grid) - mb.extra_images]
        videos = np.asarray(getattr(mb, "video_grid_thw", np.zeros((0, 3))), np.int64).reshape(-1, 3)
        self.video_grid = videos
        self.second_per_grid_ts = np.asarray(getattr(mb, "second_per_grid_ts", []), np.float32).reshape(-1)
        segments = getattr(mb, "segments", None)   # data.packing: the samples of each row
        one = mb.unpacked() if segments is not None else mb   # M-RoPE per sample: computed one sample per row
        pos, _ = side.rope_index(np.asarray(one.input_ids, np.int64), np.asarray(one.attention_mask, np.int64),
                                 self.real_grid if len(self.real_grid) else None,
                                 videos if len(videos) else None,
                                 spatial_merge_size=v.spatial_merge_size, image_token_id=cfg.image_token_id,
                                 video_token_id=cfg.video_token_id, vision_start_token_id=cfg.vision_start_token_id,
                                 second_per_grid_ts=self.second_per_grid_ts if len(videos) else None,
                                 **side.rope_options(adapter.kind, v))
        if segments is not None:
            pos = side.pack_positions(pos, segments, S)
            mask = side.packed_causal_mask(mb.segment_ids)
        else:
            mask = side.causal_mask(am)
        rows = side.image_rows(ids, cfg.image_token_id)
        if len(videos):   # video features follow every image's (the filler's too) in the encoder's output
            u = v.spatial_merge_size ** 2
            vrows = side.image_rows(ids, cfg.video_token_id)
            rows = np.where(vrows > 0, vrows + int(grid.prod(axis=1).sum()) // u, rows)
        self.input_ids, self.position_ids = _t(ids), _t(pos)
        self.mask = _t(mask)
        self.image_rows, self.is_image = _t(rows), _t((rows > 0).reshape(B, S, 1))
        self.visual_pos_masks = _t((rows > 0).reshape(B, S))
        # deepstack features come in the encoder's order; the LLM adds them in position order (mindone's joint
        # image/video features): the encoder row of each visual position, None where the orders agree
        order = rows[rows > 0] - 1
        self.visual_order = _t(order) if len(videos) and not np.array_equal(order, np.arange(len(order))) else None
        self.labels = _t(np.asarray(mb.labels, np.int64))
        self.cache_position = _t(np.arange(S, dtype=np.int64))
        grid = np.concatenate([grid, videos]) if len(videos) else grid
        self.grid, self._vision, self._pixels = grid, None, None
        self._masks, self._text_rotary, self._targets = None, None, None
        # the scale as a graph input (a Python float would be a graph constant: a compile per distinct value)
        self.loss_scale_t = Tensor(np.float32(self.loss_scale))

    @property
    def vision(self) -> Dict[str, Tensor]:
        """The vision chunks' side inputs, for every image (the filler too)."""
        if self._vision is None:
            v = self.adapter.vision
            vis = self.adapter.network().model.visual
            inv = vis.rotary_pos_emb.inv_freq.asnumpy()
            if self.adapter.kind == "qwen2_5_vl":
                d = side.qwen25_vision_side(self.grid, v, inv_freq=inv)
                out = {k: _t(d[k]) for k in ("window_index", "reverse_index", "cu_window_seqlens", "cu_seqlens")}
            else:
                d = side.qwen3_vision_side(self.grid, v, inv_freq=inv)
                out = {k: _t(d[k]) for k in ("cu_seqlens", "pos_idx", "pos_wts")}
            from .cpu import vision_cos_sin
            out["rotary"] = vision_cos_sin(d["angles"])
            self._vision = out
        return self._vision

    @property
    def vision_masks(self) -> Dict[str, Tensor]:
        """The compiled vision blocks' additive block-diagonal masks (:func:`.graph.block_mask`): ``full`` (each
        image's patches) and, Qwen2.5-VL, ``window`` (each window's)."""
        if self._masks is None:
            v = self.adapter.vision
            if self.adapter.kind == "qwen2_5_vl":
                d = side.qwen25_vision_side(self.grid, v)
                self._masks = {"full": _t(graph.block_mask(d["cu_seqlens"])),
                               "window": _t(graph.block_mask(d["cu_window_seqlens"]))}
            else:
                self._masks = {"full": _t(graph.block_mask(side.qwen3_vision_side(self.grid, v)["cu_seqlens"]))}
        return self._masks

    @property
    def text_rotary(self):
        """(cos, sin), (B, 1, S, head_dim) each: the compiled LLM layers' rotary tables (:func:`.graph.text_cos_sin`)."""
        if self._text_rotary is None:
            lm = self.adapter.network().model.language_model
            rope = getattr(self.adapter.text, "rope_scaling", None) or {}
            self._text_rotary = graph.text_cos_sin(self.adapter.kind, lm.rotary_emb, self.mask, self.position_ids,
                                                   rope.get("mrope_section"))
        return self._text_rotary

    @property
    def targets(self):
        """(targets, valid) of the compiled last chunk's loss (:func:`.graph.shifted_targets`)."""
        if self._targets is None:
            tg, valid = graph.shifted_targets(self.batch.labels)
            self._targets = (_t(tg), _t(valid))
        return self._targets

    @property
    def pixel_values(self) -> Tensor:
        if self._pixels is None:
            mb = self.batch
            pixels = mb.encoder_pixels if hasattr(mb, "encoder_pixels") else mb.pixel_values
            self._pixels = _t(np.asarray(pixels, np.float32))
        return self._pixels


# -- chunks ------------------------------------------------------------------------------------

class VisionChunk(_Slice):
    """Vision blocks ``[start, stop)``; the first chunk embeds the patches (Qwen2.5-VL: and reorders them
    into windows; Qwen3-VL: and adds the interpolated position table), the last runs the merger
    (Qwen2.5-VL: and restores the order). Qwen3-VL's deepstack features (the outputs of the blocks in
    ``deepstack_visual_indexes`` through their own mergers) travel packed with the hidden state."""

    def __init__(self, adapter, start: int, stop: int):
        net = adapter.network()
        super().__init__(net)
        vis, v = net.model.visual, adapter.vision
        self.region, self.start, self.stop = "vision", start, stop
        self.first, self.last = start == 0, stop == v.depth
        self.kind, self.ds = adapter.kind, adapter.deepstack
        self.u, self.Dv, self.D = v.spatial_merge_size ** 2, v.hidden_size, adapter.text.hidden_size
        self.full = set(getattr(v, "fullatt_block_indexes", None) or [])
        self.blocks = nn.CellList(list(vis.blocks)[start:stop])
        if self.first:
            self.patch_embed = vis.patch_embed
            if self.kind == "qwen3_vl":
                self.pos_embed = vis.pos_embed
        if self.last:
            self.merger = vis.merger
        mine = [k for k, i in enumerate(self.ds) if start <= i < stop]
        self.ds_mergers = nn.CellList([vis.deepstack_merger_list[k] for k in mine]) if mine else None
        self._named(net)
        # the compiled body's constants: per block (full attention?, index into ds_mergers or -1)
        q25 = self.kind == "qwen2_5_vl"
        self._plan = tuple((not q25 or i in self.full, mine.index(self.ds.index(i)) if i in self.ds else -1)
                           for i in range(start, stop))
        self._act = v.hidden_act
        self._k_in = sum(1 for i in self.ds if i < start)

    def graph_args(self, t: QwenTensors) -> tuple:
        """The side inputs of :meth:`graph_body` (None where this chunk reads nothing): Qwen2.5-VL's window index
        (first chunk) and reverse index (last), the blocks' masks (:attr:`QwenTensors.vision_masks`), the rotary
        table, Qwen3-VL's position-table indices and weights (first chunk)."""
        side_in, masks = t.vision, t.vision_masks
        q25 = self.kind == "qwen2_5_vl"
        cos, sin = side_in["rotary"]
        return (side_in["window_index"] if self.first and q25 else None,
                side_in["reverse_index"] if self.last and q25 else None,
                masks["window"] if any(not f for f, _ in self._plan) else None,
                masks["full"] if any(f for f, _ in self._plan) else None,
                cos, sin,
                side_in["pos_idx"] if self.first and not q25 else None,
                side_in["pos_wts"] if self.first and not q25 else None)

    def graph_body(self, x, window_index, reverse_index, window_mask, full_mask, cos, sin, pos_idx, pos_wts):
        """What :meth:`forward` computes, on tensors only (what ``mindspore.jit`` compiles; :mod:`.graph`)."""
        q25 = self.kind == "qwen2_5_vl"
        ds = ()
        if self.first:
            pe = self.patch_embed
            h = x.reshape(-1, pe.in_channels, pe.temporal_patch_size, pe.patch_size, pe.patch_size)
            h = pe.proj(h.astype(pe.proj.weight.dtype)).reshape(-1, pe.embed_dim)
            if q25:
                n = h.shape[0]
                h = ops.gather(h.reshape(n // self.u, self.u, -1), window_index, 0).reshape(n, -1)
            else:
                p = graph.embed(self.pos_embed.weight, pos_idx, None) * ops.expand_dims(pos_wts, 2)
                h = h + (p[0] + p[1] + p[2] + p[3])
        elif self.ds:
            parts = ops.split(x, [self.u * self.Dv] + [self.D] * self._k_in, axis=1)
            h = parts[0].reshape(-1, self.Dv)
            ds = tuple(parts[1:])
        else:
            h = x
        for j in range(len(self._plan)):
            full, dk = self._plan[j]
            h = graph.vision_block(self.kind, self.blocks[j], self._act, h, full_mask if full else window_mask,
                                   cos, sin)
            if dk >= 0:
                ds = ds + (graph.merger(self.kind, self.ds_mergers[dk], h),)
        if self.last:
            out = graph.merger(self.kind, self.merger, h)
            if q25:
                return ops.gather(out, reverse_index, 0)
            return ops.concat((out,) + ds, axis=1) if ds else out
        if self.ds:
            return ops.concat((h.reshape(-1, self.u * self.Dv),) + ds, axis=1)
        return h

    def forward(self, x, t: QwenTensors):
        side_in = t.vision
        rotary = side_in["rotary"]
        ds = []
        if self.first:
            h = self.patch_embed(x)
            if self.kind == "qwen2_5_vl":
                n = h.shape[0]
                h = h.reshape(n // self.u, self.u, -1)[side_in["window_index"], :, :].reshape(n, -1)
            else:
                p = self.pos_embed(side_in["pos_idx"]) * side_in["pos_wts"][:, :, None]
                h = h + (p[0] + p[1] + p[2] + p[3])
        elif self.ds:
            k_in = sum(1 for i in self.ds if i < self.start)
            parts = ops.split(x, [self.u * self.Dv] + [self.D] * k_in, axis=1)
            h, ds = parts[0].reshape(-1, self.Dv), list(parts[1:])
        else:
            h = x
        k = 0
        for i, blk in zip(range(self.start, self.stop), self.blocks):
            if self.kind == "qwen2_5_vl":
                cu = side_in["cu_seqlens"] if i in self.full else side_in["cu_window_seqlens"]
            else:
                cu = side_in["cu_seqlens"]
            h = blk(h, cu_seqlens=cu, position_embeddings=rotary)
            if i in self.ds:
                ds.append(self.ds_mergers[k](h))
                k += 1
        if self.last:
            out = self.merger(h)
            if self.kind == "qwen2_5_vl":
                return out[side_in["reverse_index"], :]
            return ops.concat([out] + ds, axis=1) if ds else out
        if self.ds:
            return ops.concat([h.reshape(-1, self.u * self.Dv)] + ds, axis=1)
        return h


class LLMChunk(_Slice):
    """Decoder layers ``[start, stop)``; the first chunk embeds the tokens and scatters the image features
    into the image-token positions (``masked_scatter``'s order), the last runs the final norm, the LM
    head and the model's own loss (``loss_function``: the mean over the micro-batch's answer tokens),
    times the loss scale. Qwen3-VL: after layer k < len(deepstack) its deepstack feature is added at the
    visual positions (mindone's ``_deepstack_process``); features still to add travel packed with the
    hidden state (one flat boundary tensor)."""

    def __init__(self, adapter, start: int, stop: int):
        net = adapter.network()
        super().__init__(net)
        lm = net.model.language_model
        self.region, self.start, self.stop = "llm", start, stop
        self.first, self.last = start == 0, stop == adapter.text.num_hidden_layers
        self.kind, self.n_ds, self.D = adapter.kind, len(adapter.deepstack), adapter.text.hidden_size
        self.vocab = adapter.text.vocab_size
        self._tp = getattr(adapter, "tp_group", None)   # tensor parallelism: the vocabulary-parallel loss
        self._aux = (lm.rotary_emb, lm, net)   # a tuple: not registered (no parameters of their own here)
        self.layers = nn.CellList(list(lm.layers)[start:stop])
        if self.first:
            self.embed_tokens = lm.embed_tokens
        if self.last:
            self.norm = lm.norm
            self.lm_head = net.lm_head
        self._named(net)
        self._act = adapter.text.hidden_act
        self._keep = graph.padding_keep(lm.embed_tokens) if self.first else None
        self._left = max(0, self.n_ds - start)   # deepstack features this chunk receives (not the first)

    def graph_args(self, t: QwenTensors) -> tuple:
        """The side inputs of :meth:`graph_body` (None where this chunk reads nothing): token ids and the image
        scatter (first chunk), the image rows again for Qwen3-VL's deepstack layers, the causal mask and the rotary
        tables (every chunk), the loss's targets, weights and scale (last chunk)."""
        rows = t.image_rows if self.first or self.start < self.n_ds else None
        cos, sin = t.text_rotary
        targets, valid = t.targets if self.last else (None, None)
        return (t.input_ids if self.first else None, rows, t.is_image if self.first else None, t.mask, cos, sin,
                targets, valid, t.loss_scale_t if self.last else None)

    def graph_body(self, x, input_ids, image_rows, is_image, mask, cos, sin, targets, valid, loss_scale):
        """What :meth:`forward` computes, on tensors only (what ``mindspore.jit`` compiles; :mod:`.graph`)."""
        B, S, D = mask.shape[0], mask.shape[-1], self.D
        ds = ()
        if self.first:
            parts = ops.split(x, [D] * (1 + self.n_ds), axis=1) if self.n_ds else (x,)
            h = graph.embed(self.embed_tokens.weight, input_ids, self._keep)
            h = ops.where(is_image, graph.scatter_rows(h, parts[0], image_rows), h)
            ds = tuple(parts[1:])
        elif self._left:
            n_h = B * S * D
            M = (x.shape[0] - n_h) // (self._left * D)
            parts = ops.split(x, [n_h] + [M * D] * self._left, axis=0)
            h = parts[0].reshape(B, S, D)
            for p in parts[1:]:
                ds = ds + (p.reshape(M, D),)
        else:
            h = x
        for j in range(len(self.layers)):
            h = graph.decoder_layer(self.kind, self.layers[j], self._act, h, mask, cos, sin)
            if self.start + j < self.n_ds:
                h = h + graph.scatter_rows(h, ds[0], image_rows)
                ds = ds[1:]
        if self.last:
            logits = self.lm_head(graph.rms_norm(self.norm, h))
            return graph.causal_lm_loss(logits, targets, valid) * loss_scale
        if ds:
            flat = (h.reshape(-1),)
            for d in ds:
                flat = flat + (d.reshape(-1),)
            return ops.concat(flat, axis=0)
        return h

    def _unpack(self, x, t: QwenTensors):
        """(hidden state, deepstack features still to add) of this chunk's input."""
        B, S = t.input_ids.shape
        M = x.shape[0] if self.first else None
        if self.first:
            parts = ops.split(x, [self.D] * (1 + self.n_ds), axis=1) if self.n_ds else [x]
            h = self.embed_tokens(t.input_ids)
            table = ops.concat((ops.zeros((1, self.D), h.dtype), parts[0].astype(h.dtype)), axis=0)
            h = ops.where(t.is_image, ops.gather(table, t.image_rows, 0).reshape(B, S, self.D), h)
            return h, list(parts[1:]), M
        left = max(0, self.n_ds - self.start)
        if not left:
            return x, [], None
        n_h = B * S * self.D
        M = (x.shape[0] - n_h) // (left * self.D)
        parts = ops.split(x, [n_h] + [M * self.D] * left, axis=0)
        return parts[0].reshape(B, S, self.D), [p.reshape(M, self.D) for p in parts[1:]], M

    def forward(self, x, t: QwenTensors):
        rotary_emb, lm, net = self._aux
        h, ds, _ = self._unpack(x, t)
        pe = rotary_emb(h, t.position_ids)
        for i, layer in zip(range(self.start, self.stop), self.layers):
            if self.kind == "qwen2_5_vl":
                h = layer(h, attention_mask=t.mask, position_ids=t.position_ids[0], position_embeddings=pe)[0]
            else:
                h = layer(h, attention_mask=t.mask, position_ids=t.position_ids[0], past_key_values=None,
                          cache_position=t.cache_position, position_embeddings=pe)
                if i < self.n_ds:
                    feat = ds.pop(0)
                    if t.visual_order is not None:
                        feat = ops.gather(feat, t.visual_order, 0)
                    h = lm._deepstack_process(h, t.visual_pos_masks, feat)
        if self.last:
            logits = self.lm_head(self.norm(h))
            if self._tp is not None:   # this rank's vocabulary slice of the logits (:mod:`.tp`)
                from ..tensor_parallel import vocab_cross_entropy
                loss = vocab_cross_entropy(logits, t.labels, self._tp.rank * logits.shape[-1], self._tp,
                                           vocab=self.vocab)   # a padded vocabulary's real size
            else:
                loss = net.loss_function(logits=logits, labels=t.labels, vocab_size=self.vocab)
            return loss * t.loss_scale
        if ds:
            return ops.concat([h.reshape(-1)] + [d.reshape(-1) for d in ds], axis=0)
        return h


# -- the model as users call it ------------------------------------------------------------------

class WholeModel:
    """The single-process reference: mindone's whole model called as users call it,
    ``model(input_ids=..., attention_mask=..., pixel_values=..., image_grid_thw=..., labels=...)``
    with an explicit attention mask, on the real images only (no filler), and a micro-batch's videos as
    ``pixel_values_videos=..., video_grid_thw=...`` (Qwen2.5-VL: ``second_per_grid_ts=...`` too); with ``model.lora`` the PeftModel
    (``get_peft_model``'s) is called. Its trained parameters are ``trainable_params()``: the adapters alone
    under LoRA."""

    def __init__(self, adapter):
        self.adapter = adapter
        self.net = adapter.network()
        self.cells = {"model": self.net}

    def params(self, region: str) -> list:
        vis = [p for p in self.net.model.visual.trainable_params()]
        if region == "vision":
            return vis
        seen = {id(p) for p in vis}
        return [p for p in self.net.trainable_params() if id(p) not in seen]

    def loss(self, mb, loss_scale: float):
        """``data.packing``: the packed micro-batch's samples one per row (:meth:`~.batch.QwenVLBatch.unpacked`),
        as users call the model on them: the same answer tokens, so the same mean over them."""
        mb = mb.unpacked() if getattr(mb, "segments", None) is not None else mb
        t = QwenTensors(self.adapter, mb, loss_scale)
        real = len(t.real_grid) > 0
        n = int(np.prod(t.real_grid, axis=1).sum()) if real else 0
        pixels = _t(np.asarray(mb.pixel_values, np.float32)[:n]) if real else None
        videos = {}
        if len(t.video_grid):
            videos = dict(pixel_values_videos=_t(np.asarray(mb.pixel_values_videos, np.float32)),
                          video_grid_thw=_t(t.video_grid))
            if self.adapter.kind == "qwen2_5_vl":
                videos["second_per_grid_ts"] = _t(t.second_per_grid_ts)
        model = self.adapter.peft or self.net   # with model.lora: the PeftModel, as users call it
        out = model(input_ids=t.input_ids, attention_mask=_t(np.asarray(mb.attention_mask, np.int64)),
                    pixel_values=pixels, image_grid_thw=_t(t.real_grid) if real else None, labels=t.labels,
                    use_cache=False, **videos)
        return out.loss * loss_scale
