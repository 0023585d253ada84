"""A cost profile estimated from the model config, for recipes without ``mpipe.profile`` (pure Python).

Per region and layer, from the tower's config (Hugging Face / MindFormers field names): parameters of a
transformer layer (attention with grouped KV heads, a gated or plain MLP), forward FLOPs over the
micro-batch's tokens (``2 x parameters x tokens`` plus attention's ``4 x tokens x context x hidden``),
backward B = forward and W = the weight-gradient matmuls (``2 x parameters x tokens``), activation bytes
kept for backward (the usual ``tokens x hidden x (34 + 5 x heads x context / hidden)`` half-precision
count, doubled for float32), output bytes, parameter bytes; the language model's head (``vocab x hidden``)
and an encoder's projector as the region's head. Times are FLOPs at an *assumed* sustained rate per
device (:data:`RATE_TFLOPS`); they rank schedules, they do not predict seconds. ``hyperparallel profile
RECIPE --out FILE`` measures the real costs. The costs are a whole layer's: with
``parallel_config.model_parallel`` T the cost model splits the language model's over T
(:func:`~hyperparallel.mpipe.cost.tensor_parallel_profile`). Parameter bytes: ``param_init_type``, else
float32 (the runtime's mixed precision keeps float32 master weights, grads and Adam state); activations
and outputs in the compute dtype (``compute_dtype`` / ``torch_dtype`` / ``dtype``).

Tokens per micro-batch: the language model's sequence length (``data.seq_len``, else the model's
``seq_length``, else ``data.text_len`` plus images) times the micro-batch size; an encoder's images per sample from ``data.images_per_sample`` (+ video), else 1
(assumed), and its tokens per image from ``data.max_pixels`` / ``data.image_size`` and the patch size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

from .schema import SYNTHETIC_IMAGES

#: assumed sustained dense-matmul rate per device, TFLOP/s (an estimate, stated in the output): a CPU rank
#: of MindSpore PyNative float32 kernels; an Ascend 910B at ~40% of its ~300 TFLOP/s half-precision peak
RATE_TFLOPS = {"CPU": 0.05, "Ascend": 120.0}
_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _pos(v):
    """``v`` if it is a finite number in (0, 1e12] (a size the estimate can use), else None."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 < v <= 1e12:
        return v
    return None


def _first(cfg: dict, *keys, default=None):
    for k in keys:
        if _pos(cfg.get(k)) is not None:
            return cfg[k]
    return default


def _dtype_bytes(cfg: dict, *keys, default: int = 4) -> int:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, str) and v in _BYTES:
            return _BYTES[v]
    return default


@dataclass(frozen=True)
class LayerShape:
    """A transformer layer's sizes, read off a tower config."""

    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    gated: bool

    @property
    def params(self) -> int:
        head_dim = self.hidden // max(self.heads, 1)
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * head_dim * self.kv_heads
        return attn + (3 if self.gated else 2) * self.hidden * self.ffn


def layer_shape(cfg: dict, is_llm: bool) -> Optional[LayerShape]:
    """The layer sizes of a tower config (None without a hidden size)."""
    h = _first(cfg, "hidden_size", "embed_dim", "dim", "n_embd")
    if not h:
        return None
    h = int(h)
    heads = int(_first(cfg, "num_attention_heads", "num_heads", "n_head", "n_heads", default=max(1, h // 64)))
    kv = int(_first(cfg, "num_key_value_heads", "n_kv_heads", "num_kv_heads", default=heads))
    ratio = _first(cfg, "mlp_ratio")
    ffn = int(_first(cfg, "intermediate_size", "ffn_hidden_size", default=(ratio or 4) * h))
    act = cfg.get("hidden_act")
    gated = act in ("silu", "swish", "swiglu") if isinstance(act, str) else is_llm
    return LayerShape(h, ffn, heads, kv, gated)


def _images_per_sample(data: dict) -> Tuple[float, str]:
    src = "data.images_per_sample" if "images_per_sample" in data else "the generated data's default mix"
    if data.get("type", "synthetic") == "synthetic":   # generated data: its defaults where data: does not say
        data = {**SYNTHETIC_IMAGES, **data}
    p = data.get("images_per_sample")
    if isinstance(p, (list, tuple)) and p and all(x == 0 or _pos(x) is not None for x in p):
        mean = sum(i * float(x) for i, x in enumerate(p))
        vp = data.get("video_prob", 0.0)
        vp = float(vp) if _pos(vp) is not None and vp <= 1 else 0.0
        mean = (1 - vp) * mean + vp * float(_pos(data.get("video_frames")) or 0)
        return mean, f"{mean:.2f} images per sample ({src})"
    return 1.0, "1 image per sample (assumed)"


def _tokens_per_image(cfg: dict, data: dict) -> Tuple[float, str]:
    patch = _first(cfg, "patch_size", default=_pos(data.get("patch")))
    if _pos(data.get("max_pixels")) is not None and patch:
        n = float(data["max_pixels"]) / (patch * patch)
        return n, f"{n:.0f} patches per image (data.max_pixels)"
    size = _pos(data.get("image_size")) or _pos(cfg.get("image_size"))
    if size is not None and patch:
        n = (float(size) / patch) ** 2
        return n, f"{n:.0f} patches per image ({size}/{patch} squared)"
    return 256.0, "256 patches per image (assumed)"


def _seq_len(model_cfg: dict, data: dict) -> Tuple[int, str]:
    if isinstance(_pos(data.get("seq_len")), int):
        return data["seq_len"], "data.seq_len"
    if isinstance(_pos(model_cfg.get("seq_length")), int):
        return model_cfg["seq_length"], "seq_length"
    if isinstance(_pos(data.get("text_len")), int):
        p = data.get("images_per_sample")
        p = p if isinstance(p, list) and p else [0, 1]
        return data["text_len"] + max(len(p) - 1, 0), "data.text_len + images"
    return 2048, "assumed"


def param_bytes(model_cfg: dict) -> int:
    """Bytes per parameter of the model config (MindFormers' ``param_init_type``; 4 when not given)."""
    return _dtype_bytes(model_cfg, "param_init_type", default=4)


def estimated_profile(towers: List, model_cfg: dict, data: dict, device: str, batch: int) -> Tuple[Optional[dict], str]:
    """(``mpipe.profile`` mapping, one-line statement of the assumptions), or (None, why) when a tower
    has no sizes to estimate from."""
    rate = RATE_TFLOPS.get(device, RATE_TFLOPS["CPU"]) * 1e12
    act_bytes = _dtype_bytes(model_cfg, "compute_dtype", "torch_dtype", "dtype", default=4)
    par_bytes = param_bytes(model_cfg)
    seq, seq_from = _seq_len(model_cfg, data)
    notes = [f"{batch} sequence(s) x {seq} tokens ({seq_from}) per micro-batch"]
    regions = []
    llm_hidden = None
    for t in reversed(towers):
        shape = layer_shape(t.config, t.name == "llm")
        if shape is None:
            return None, f"{t.key.rsplit('.', 1)[0]} has no hidden_size"
        if t.name == "llm":
            llm_hidden = shape.hidden
    ms = 1e3 / rate
    for t in towers:
        shape = layer_shape(t.config, t.name == "llm")
        if t.name == "llm":
            tokens, ctx = batch * seq, seq
            vocab = int(_first(t.config, "vocab_size", default=_first(model_cfg, "vocab_size", default=32000)))
            head = 2.0 * vocab * shape.hidden * tokens
        else:
            ips, n1 = _images_per_sample(data)
            tpi, n2 = _tokens_per_image(t.config, data)
            tokens, ctx = batch * ips * tpi, tpi
            merge = int(_first(t.config, "spatial_merge_size", default=1))
            out = int(_first(t.config, "out_hidden_size", default=llm_hidden or shape.hidden))
            inner = shape.hidden * merge * merge
            head = 2.0 * (inner * inner + inner * out) * tokens / (merge * merge)
            notes.append(f"{t.name}: {n1}, {n2}")
        matmul = 2.0 * shape.params * tokens
        attn = 4.0 * tokens * ctx * shape.hidden
        act_mb = tokens * shape.hidden * (34 + 5 * shape.heads * ctx / shape.hidden) * act_bytes / 2 / 2 ** 20
        regions.append(dict(name=t.name, layers=t.layers, trainable=True,
                            forward_ms=(matmul + attn) * ms, backward_ms=(matmul + 2 * attn) * ms,
                            weight_ms=matmul * ms, activation_mb=act_mb,
                            output_mb=tokens * shape.hidden * act_bytes / 2 ** 20,
                            param_mb=shape.params * par_bytes / 2 ** 20,
                            head_forward_ms=head * ms, head_backward_ms=head * ms, head_weight_ms=head * ms))
    note = (f"costs estimated from the model config (FLOPs at an assumed {rate / 1e12:g} TFLOP/s per {device} "
            f"device; {'; '.join(notes)}); give mpipe.profile or measure one with hyperparallel profile --out")
    return {"regions": regions}, note
