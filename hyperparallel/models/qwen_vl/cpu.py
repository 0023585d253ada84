"""CPU compatibility layer for mindone 0.5.0's Qwen2.5-VL / Qwen3-VL on MindSpore 2.9.0 (CPU only).

mindone calls ``mindspore.mint`` (pyboost "Ext" kernels). On CPU many have no kernel, and a few run
but are silently wrong. :func:`apply` routes exactly those to old-style ``mindspore.ops`` primitives
(which have CPU kernels) or to numpy for index-only work. It does nothing on other devices
(:func:`needed`), and it must run BEFORE the model is built: cells (``mint.nn.Embedding``,
``LayerNorm``, ``GELU``, ``Conv3d``) and activations (``F.gelu``) are bound at construction.

Where it patches (the narrowest points that work; :func:`remove` restores all of them):

* the module globals ``mint`` / ``F`` / ``nn`` (and any global bound to a replaced object) of the
  mindone modules in ``MODULES``: they become proxy namespaces that override the names below and
  delegate every other name to the real module. ``mindspore.mint`` itself is never modified;
* ``Tensor.repeat``, ``Tensor.clone`` and ``Tensor.new_zeros`` on ``mindspore.Tensor`` (process-wide while
  applied; the first two raise on CPU otherwise, the third on any device when called torch's way, so no
  working code changes behaviour);
* three mindone methods: ``Qwen2_5_VLModel.get_rope_index``, ``Qwen3VLModel.get_rope_index`` and
  ``Qwen3VLTextModel._deepstack_process``.

Replacements (name as mindone calls it -> replacement: the MindSpore CPU behaviour behind it):

  mint.arange               -> numpy                  : kernel Arange unregistered (index-only use)
  mint.linspace             -> numpy, torch's float32 formula (side.torch_linspace) : LinSpaceExt missing
  mint.ones_like/zeros_like -> ops.ones_like/zeros_like : OnesLikeExt / ZerosLikeExt missing
  mint.stack                -> ops.stack              : StackExt missing
  mint.outer                -> ops.outer              : Outer missing
  mint.repeat_interleave    -> numpy (ints) / ops.gather (floats) : RepeatInterleaveInt/Tensor missing
  mint.argsort              -> numpy stable argsort   : ArgSort missing (index-only use)
  mint.split                -> ops.split              : SILENTLY WRONG: mint.split is split_view, whose
                                                        backward is wrong when its outputs' grads are
                                                        non-contiguous (vision attention: every vision
                                                        gradient off by 27-51%)
  F.pad                     -> ops.pad                : ConstantPadND missing
  F.gelu, mint.nn.GELU      -> ops.gelu               : GeluExt missing
  F.dropout                 -> identity (p=0 or eval), else ops.dropout : "Not implement" even at p=0
  F.embedding, mint.nn.Embedding -> ops.gather        : Embedding missing (padding_idx row gets no grad)
  F.layer_norm, mint.nn.LayerNorm -> ops.LayerNorm primitive : LayerNormExt kernelmod fails
  F.cross_entropy, mint.nn.CrossEntropyLoss -> ops.log_softmax + gather_elements : LogSoftmaxExt missing
  mint.nn.Conv3d            -> ops.conv3d             : Conv3DExt missing
  Tensor.repeat             -> ops.tile               : "'repeat' is not supported on this device"
  Tensor.clone              -> ops.deepcopy           : Clone missing; ops.identity returns the SAME
                                                        object in PyNative (aliasing), so it cannot stand in
  Tensor.new_zeros(n, d)    -> ops.zeros((n, d))      : Qwen3-VL's joint image + video deepstack features
                                                        call it torch's way (sizes as arguments, n a 0-d
                                                        Tensor); MindSpore reads the 2nd as a dtype and raises
  get_rope_index (both)     -> numpy side.rope_index : SILENTLY WRONG: a sum/any over an EMPTY
                                                        tensor returns uninitialised memory, so a text-only
                                                        sample next to an image sample gets garbage image
                                                        counts; its text-only branch calls in-place
                                                        masked_fill_ (InplaceMaskedFillScalar missing;
                                                        add_ / mul_ / copy_ into views are silent no-ops)
  Qwen3VLTextModel._deepstack_process -> h + gather(cat(0, e), rows) : SILENTLY WRONG: its N-d bool-mask
                                                        getitem ``h[mask, :]`` has the wrong shape or raises,
                                                        and it uses Tensor.clone

Replacement cells subclass the mint cells, so parameter names and ``isinstance`` checks are unchanged;
a model built while applied keeps its cells after :func:`remove`.
"""
from __future__ import annotations

import importlib
from typing import Dict, List, Tuple

import numpy as np
import mindspore as ms
import mindspore.mint as _mint
import mindspore.mint.nn.functional as _F
from mindspore import Tensor, ops

from .side import rope_index, torch_linspace

__all__ = ["apply", "remove", "is_applied", "needed", "original", "vision_cos_sin", "MODULES", "REPLACED"]

MODULES = (
    "mindone.transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
    "mindone.transformers.models.qwen3_vl.modeling_qwen3_vl",
    "mindone.transformers.activations",
    "mindone.transformers.masking_utils",
    "mindone.transformers.loss.loss_utils",
    "mindone.transformers.modeling_rope_utils",
)
_MISSING = object()
_SAVED: List[Tuple[object, str, object]] = []   # (owner, attribute, previous value or _MISSING)


def _scalar(v):
    return v.item() if isinstance(v, Tensor) else v


# -- functions ---------------------------------------------------------------------------------

def arange(start=0, end=None, step=1, *, dtype=None):
    start, end, step = _scalar(start), _scalar(end), _scalar(step)
    if end is None:
        start, end = 0, start
    if dtype is None:
        ints = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
        dtype = ms.int64 if ints else ms.float32
    return Tensor(np.arange(start, end, step).astype(ms.dtype_to_nptype(dtype)))


def linspace(start, end, steps, *, dtype=None):
    out = torch_linspace(float(_scalar(start)), float(_scalar(end)), int(_scalar(steps)))
    return Tensor(out if dtype is None else out.astype(ms.dtype_to_nptype(dtype)))


def ones_like(input, *, dtype=None):
    out = ops.ones_like(input)
    return out if dtype is None else out.astype(dtype)


def zeros_like(input, *, dtype=None):
    out = ops.zeros_like(input)
    return out if dtype is None else out.astype(dtype)


def stack(tensors, dim=0):
    return ops.stack(tuple(tensors), axis=dim)


def outer(input, vec2):
    return ops.outer(input, vec2)


def repeat_interleave(input, repeats, dim=None, *, output_size=None):
    reps = repeats.asnumpy() if isinstance(repeats, Tensor) else np.asarray(repeats)
    if input.dtype in (ms.bool_, ms.int8, ms.int16, ms.int32, ms.int64, ms.uint8):
        return Tensor(np.repeat(input.asnumpy(), reps, axis=dim))
    x, d = (input.reshape(-1), 0) if dim is None else (input, dim)
    idx = np.repeat(np.arange(x.shape[d]), np.broadcast_to(reps, (x.shape[d],)))
    return ops.gather(x, Tensor(idx.astype(np.int64)), d)


def argsort(input, dim=-1, descending=False, *, stable=False):
    a = input.asnumpy()
    return Tensor(np.argsort(-a if descending else a, axis=dim, kind="stable").astype(np.int64))


def split(tensor, split_size_or_sections, dim=0):
    sizes = split_size_or_sections
    if isinstance(sizes, Tensor):
        sizes = sizes.tolist()
    if isinstance(sizes, (list, tuple)):
        sizes = [int(_scalar(v)) for v in sizes]
    return ops.split(tensor, sizes, axis=dim)


def pad(input, pad, mode="constant", value=None):
    return ops.pad(input, tuple(int(p) for p in pad), mode=mode, value=0 if value is None else value)


def gelu(input, approximate="none"):
    return ops.gelu(input, approximate=approximate)


def dropout(input, p=0.5, training=True, inplace=False):
    return input if not training or p == 0 else ops.dropout(input, p=p, training=True)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False):
    if max_norm is not None or scale_grad_by_freq:
        raise NotImplementedError("mindone_cpu.embedding: max_norm / scale_grad_by_freq are not supported")
    if padding_idx is not None:   # same forward; the padding row gets no gradient (torch semantics)
        keep = np.ones((weight.shape[0], 1), np.float32)
        keep[padding_idx] = 0
        keep = Tensor(keep, weight.dtype)
        weight = weight * keep + ops.stop_gradient(weight) * (1 - keep)
    return ops.gather(weight, input, 0)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    weight = ops.ones(shape, input.dtype) if weight is None else weight
    bias = ops.zeros(shape, input.dtype) if bias is None else bias
    k = -len(shape)
    return ops.LayerNorm(begin_norm_axis=k, begin_params_axis=k, epsilon=eps)(input, weight, bias)[0]


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """Class-index targets; input (N, C), (C,) or (N, C, d...); torch's reductions."""
    if weight is not None or label_smoothing:
        raise NotImplementedError("mindone_cpu.cross_entropy: weight / label_smoothing are not supported")
    if input.ndim == 1:
        input, target = input.reshape(1, -1), target.reshape(1)
    elif input.ndim > 2:
        input, target = ops.moveaxis(input, 1, -1).reshape(-1, input.shape[1]), target.reshape(-1)
    valid = target != ignore_index
    safe = ops.where(valid, target, ops.zeros_like(target)).astype(ms.int64)
    nll = -ops.gather_elements(ops.log_softmax(input, axis=-1), 1, safe.reshape(-1, 1)).reshape(-1)
    nll = nll * valid.astype(nll.dtype)
    if reduction == "none":
        return nll
    return nll.sum() if reduction == "sum" else nll.sum() / valid.astype(nll.dtype).sum()


# -- cells (subclasses: same parameters, names and isinstance) ---------------------------------

class Embedding(_mint.nn.Embedding):
    def construct(self, input):
        return embedding(input, self.weight, self.padding_idx, self.max_norm, self.norm_type, self.scale_grad_by_freq)


class GELU(_mint.nn.GELU):
    def construct(self, input):
        return ops.gelu(input, approximate=self.approximate)


class LayerNorm(_mint.nn.LayerNorm):
    def construct(self, input):
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class Conv3d(_mint.nn.Conv3d):
    def construct(self, input):
        if self.padding_mode != "zeros":
            raise NotImplementedError(f"mindone_cpu.Conv3d: padding_mode {self.padding_mode!r} is not supported")
        p = self.padding
        if isinstance(p, str):
            return ops.conv3d(input, self.weight, self.bias, self.stride, pad_mode=p, dilation=self.dilation,
                              groups=self.groups)
        p = (p,) * 3 if isinstance(p, int) else tuple(p)
        mode, p = ("valid", 0) if not any(p) else ("pad", p)
        return ops.conv3d(input, self.weight, self.bias, self.stride, mode, p, self.dilation, self.groups)


class CrossEntropyLoss(_mint.nn.CrossEntropyLoss):
    def construct(self, input, target):
        return cross_entropy(input, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing)


# -- Tensor and mindone methods ----------------------------------------------------------------

def _tensor_repeat(self, *sizes):
    sizes = tuple(int(s) for s in (sizes[0] if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)) else sizes))
    x = self.reshape((1,) * (len(sizes) - self.ndim) + tuple(self.shape)) if len(sizes) > self.ndim else self
    return ops.tile(x, sizes)


def _tensor_new_zeros(self, *size, dtype=None, **kwargs):
    """torch's ``new_zeros(*size)``: the sizes as separate arguments (ints or 0-d Tensors) or one sequence,
    a dtype after them or by keyword; zeros of ``self``'s dtype by default."""
    if size and isinstance(size[-1], ms.Type):
        size, dtype = size[:-1], size[-1]
    if len(size) == 1 and isinstance(size[0], (list, tuple)):
        size = tuple(size[0])
    shape = tuple(int(s.asnumpy()) if isinstance(s, Tensor) else int(s) for s in size)
    return ops.zeros(shape, dtype if dtype is not None else self.dtype)


def _tensor_clone(self, *args, **kwargs):
    return ops.deepcopy(self)   # a copy (gradient passes through unchanged), never an alias


def _deepstack_process(self, hidden_states, visual_pos_masks, visual_embeds):
    """``h[mask] += e`` as ``h + gather(cat(zeros(1, D), e), rows)`` (differentiable in h and e)."""
    b, s, d = hidden_states.shape
    hit = visual_pos_masks.asnumpy().reshape(-1).astype(bool)
    rows = np.zeros(b * s, np.int64)
    rows[hit] = np.arange(1, int(hit.sum()) + 1)
    table = ops.concat((ops.zeros((1, d), hidden_states.dtype), visual_embeds.astype(hidden_states.dtype)), axis=0)
    return hidden_states + ops.gather(table, Tensor(rows), 0).reshape(b, s, d)


def _np(t):
    return None if t is None else t.asnumpy()


def _rope_tensors(self, input_ids, image_grid_thw, video_grid_thw, attention_mask, second_per_grid_ts, qwen3):
    vc = self.config.vision_config
    kw = dict(per_frame_video=True) if qwen3 else dict(per_frame_video=False,
                                                       tokens_per_second=vc.tokens_per_second,
                                                       second_per_grid_ts=_np(second_per_grid_ts))
    pos, deltas = rope_index(_np(input_ids), _np(attention_mask), _np(image_grid_thw), _np(video_grid_thw),
                             spatial_merge_size=vc.spatial_merge_size, image_token_id=self.config.image_token_id,
                             video_token_id=self.config.video_token_id,
                             vision_start_token_id=self.config.vision_start_token_id, **kw)
    return Tensor(pos), Tensor(deltas)


def _qwen25_get_rope_index(self, input_ids=None, image_grid_thw=None, video_grid_thw=None, second_per_grid_ts=None,
                           attention_mask=None):
    """mindone's Qwen2_5_VLModel.get_rope_index, computed by side.rope_index."""
    return _rope_tensors(self, input_ids, image_grid_thw, video_grid_thw, attention_mask, second_per_grid_ts, False)


def _qwen3_get_rope_index(self, input_ids=None, image_grid_thw=None, video_grid_thw=None, attention_mask=None):
    """mindone's Qwen3VLModel.get_rope_index, computed by side.rope_index."""
    return _rope_tensors(self, input_ids, image_grid_thw, video_grid_thw, attention_mask, None, True)


def vision_cos_sin(angles) -> Tuple[Tensor, Tensor]:
    """The vision towers' ``position_embeddings`` from ``side``'s rotary angles (N, head_dim/2):
    ``emb = cat(angles, angles)`` and MindSpore's ``emb.cos(), emb.sin()``, exactly as mindone computes
    them (bit-exact on any device; numpy's cos/sin differ by an ulp)."""
    a = Tensor(np.ascontiguousarray(angles, np.float32))
    emb = _mint.cat((a, a), dim=-1)
    return emb.cos(), emb.sin()


# -- apply / remove ----------------------------------------------------------------------------

class _Namespace:
    """A module proxy: the overrides first, then the wrapped module."""

    def __init__(self, base, overrides):
        self.__dict__.update(overrides)
        self._base = base

    def __getattr__(self, name):   # only called for names that are not overridden
        if name == "_base":
            raise AttributeError(name)
        return getattr(self._base, name)

    def __repr__(self):
        return f"<mindone_cpu proxy of {self._base.__name__}>"


_F_NEW = dict(pad=pad, gelu=gelu, dropout=dropout, embedding=embedding, layer_norm=layer_norm,
              cross_entropy=cross_entropy)
_NN_NEW = dict(Embedding=Embedding, GELU=GELU, LayerNorm=LayerNorm, Conv3d=Conv3d, CrossEntropyLoss=CrossEntropyLoss)
_MINT_NEW = dict(arange=arange, linspace=linspace, ones_like=ones_like, zeros_like=zeros_like, stack=stack,
                 outer=outer, repeat_interleave=repeat_interleave, argsort=argsort, split=split)
REPLACED = tuple([f"mint.{k}" for k in _MINT_NEW] + [f"mint.nn.functional.{k}" for k in _F_NEW]
                 + [f"mint.nn.{k}" for k in _NN_NEW]
                 + ["Tensor.repeat", "Tensor.clone", "Tensor.new_zeros", "Qwen2_5_VLModel.get_rope_index", "Qwen3VLModel.get_rope_index",
                    "Qwen3VLTextModel._deepstack_process"])


def needed() -> bool:
    """True when MindSpore's device target is CPU (the only device this layer is for)."""
    return ms.get_context("device_target") == "CPU"


def is_applied() -> bool:
    return bool(_SAVED)


def _set(owner, name, value) -> None:
    old = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name, _MISSING)
    _SAVED.append((owner, name, old))
    setattr(owner, name, value)


def apply() -> bool:
    """Install the replacements on CPU (idempotent) and return True; elsewhere do nothing, return False.
    Call after ``mindspore.set_device`` and before building a model (module docstring)."""
    if _SAVED:
        return True
    if not needed():
        return False
    f = _Namespace(_F, _F_NEW)
    nn = _Namespace(_mint.nn, dict(_NN_NEW, functional=f))
    mint = _Namespace(_mint, dict(_MINT_NEW, nn=nn))
    swap: Dict[int, object] = {id(_mint): mint, id(_mint.nn): nn, id(_F): f}
    swap.update({id(getattr(_mint, k)): v for k, v in _MINT_NEW.items()})
    swap.update({id(getattr(_F, k)): v for k, v in _F_NEW.items()})
    swap.update({id(getattr(_mint.nn, k)): v for k, v in _NN_NEW.items()})
    for name in MODULES:
        mod = importlib.import_module(name)
        for attr, val in list(vars(mod).items()):
            if id(val) in swap:
                _set(mod, attr, swap[id(val)])
    _set(Tensor, "repeat", _tensor_repeat)
    _set(Tensor, "clone", _tensor_clone)
    _set(Tensor, "new_zeros", _tensor_new_zeros)
    from mindone.transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as q25
    from mindone.transformers.models.qwen3_vl import modeling_qwen3_vl as q3
    _set(q25.Qwen2_5_VLModel, "get_rope_index", _qwen25_get_rope_index)
    _set(q3.Qwen3VLModel, "get_rope_index", _qwen3_get_rope_index)
    _set(q3.Qwen3VLTextModel, "_deepstack_process", _deepstack_process)
    return True


def original(owner, name):
    """``owner.name`` as it was before :func:`apply` (the current value when not patched)."""
    for o, n, old in _SAVED:
        if o is owner and n == name:
            if old is _MISSING:   # was inherited
                return next(c.__dict__[name] for c in owner.__mro__[1:] if name in c.__dict__)
            return old
    return getattr(owner, name)


def remove() -> None:
    """Undo :func:`apply`, newest patch first (a no-op when not applied)."""
    while _SAVED:
        owner, name, old = _SAVED.pop()
        if old is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, old)
