"""hyperparallel.models.qwen_vl.cpu: every replacement against numpy (values, and float64
finite-difference gradients where differentiable), tests pinning each CPU behaviour the layer works
around (they fail, saying so, the day MindSpore changes it), apply / remove, and directional
finite-difference checks of the whole tiny Qwen2.5-VL / Qwen3-VL gradients with the layer applied.

The tiny models and batches built here are shared with tests/unit/test_qwen_vl_side.py.
"""
import functools
import math
import os

os.environ.setdefault("GLOG_v", "3")

import numpy as np
import pytest

pytest.importorskip("mindone")

import mindspore as ms  # noqa: E402
from mindspore import Tensor, mint, ops  # noqa: E402

from hyperparallel.runtime.compat import setup_device  # noqa: E402
from hyperparallel.models.qwen_vl import cpu as mc  # noqa: E402
from hyperparallel.models.qwen_vl import side  # noqa: E402

setup_device("CPU")
mc.apply()

RNG = np.random.RandomState(1234)
# the project's demo-tokenizer ids for the Qwen special tokens; text ids are TEXT, padding 0
VISION_START, VISION_END, IMAGE, VIDEO = 8, 9, 10, 11
TEXT = (12, 256)


# -- tiny models and batches (also used by test_qwen_vl_side.py) --------------------------------

def tiny_config(kind: str):
    """Tiny Qwen2.5-VL ('25') or Qwen3-VL ('3') config: float32, eager attention, vocab 256."""
    from transformers import Qwen2_5_VLConfig, Qwen3VLConfig
    tokens = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VISION_START,
                  vision_end_token_id=VISION_END)
    vision = dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64)
    text = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0,
                hidden_act="silu", use_cache=False, tie_word_embeddings=False, attention_dropout=0.0)
    if kind == "25":
        vision.update(window_size=16, fullatt_block_indexes=[1, 3], hidden_act="silu", tokens_per_second=2)
        text.update(rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
        cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, use_cache=False,
                               **tokens)
    else:
        vision.update(num_position_embeddings=64, hidden_act="gelu_pytorch_tanh", deepstack_visual_indexes=[0, 2])
        text.update(head_dim=32, attention_bias=False,
                    rope_scaling={"rope_type": "default", "mrope_section": [6, 5, 5], "mrope_interleaved": True})
        cfg = Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **tokens)
    cfg.dtype = "float32"
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "eager"
    return cfg


@functools.lru_cache(maxsize=None)
def tiny_model(kind: str):
    """(config, model) in eval mode, the 1-D parameters (norms, biases) randomised so that their
    gradients are exercised. Built once per process: tests that change parameters restore them."""
    from mindone.transformers import Qwen2_5_VLForConditionalGeneration, Qwen3VLForConditionalGeneration
    assert mc.is_applied(), "mindone_cpu.apply() must precede building the model"
    cfg = tiny_config(kind)
    ms.set_seed(0)
    np.random.seed(0)
    model = (Qwen2_5_VLForConditionalGeneration if kind == "25" else Qwen3VLForConditionalGeneration)(cfg)
    model.set_train(False)
    rng = np.random.RandomState(1)
    for p in model.trainable_params():
        if p.ndim == 1:
            p.set_data(Tensor((p.asnumpy() + 0.1 * rng.randn(*p.shape)).astype(np.float32)))
    return cfg, model


def make_batch(cfg, grids, text_lens, seed=0, pad_left=False):
    """numpy batch: sample i is text_a, <vision_start> <image>*n <vision_end>, text_b (no image when
    grids[i] is None), n = t*h*w / merge^2, padded with 0. labels: -100 at padding and vision tokens."""
    rng = np.random.RandomState(seed)
    v = cfg.vision_config
    cpp = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    seqs, pix, thw = [], [], []
    for g, (na, nb) in zip(grids, text_lens):
        ids = list(rng.randint(*TEXT, size=na))
        if g is not None:
            t, h, w = g
            ids += [VISION_START] + [IMAGE] * (t * h * w // v.spatial_merge_size ** 2) + [VISION_END]
            pix.append(rng.randn(t * h * w, cpp).astype(np.float32))
            thw.append(g)
        seqs.append(ids + list(rng.randint(*TEXT, size=nb)))
    s = max(map(len, seqs))
    ids = np.zeros((len(seqs), s), np.int64)
    mask = np.zeros((len(seqs), s), np.int64)
    for i, q in enumerate(seqs):
        sl = slice(s - len(q), s) if pad_left else slice(0, len(q))
        ids[i, sl], mask[i, sl] = q, 1
    labels = np.where((mask == 1) & ~np.isin(ids, [VISION_START, VISION_END, IMAGE, VIDEO]), ids, -100)
    return dict(input_ids=ids, attention_mask=mask, labels=labels,
                pixel_values=np.concatenate(pix) if pix else None,
                image_grid_thw=np.array(thw, np.int64) if thw else None)


def tensors(batch):
    return {k: None if v is None else Tensor(v) for k, v in batch.items()}


# -- numeric helpers ---------------------------------------------------------------------------

def f32(*shape):
    return RNG.randn(*shape).astype(np.float32)


def num_grad(np_fn, args, wrt, cot, eps=1e-6):
    """float64 central-difference gradient of sum(np_fn(*args) * cot) w.r.t. args[wrt]."""
    args = [a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args]
    x, g = args[wrt], np.zeros(args[wrt].shape)
    for i in np.ndindex(x.shape):
        for sign in (1, -1):
            xx = x.copy()
            xx[i] += sign * eps
            g[i] += sign * float((np.asarray(np_fn(*(args[:wrt] + [xx] + args[wrt + 1:]))) * cot).sum())
    return g / (2 * eps)


def check(ms_fn, np_fn, args, wrt=(), atol=2e-5):
    """ms_fn(*args) == np_fn(*args) and, for the positions in ``wrt``, its gradients equal numpy's."""
    targs = [Tensor(a) if isinstance(a, np.ndarray) else a for a in args]
    ref = np.asarray(np_fn(*args))
    np.testing.assert_allclose(ms_fn(*targs).asnumpy(), ref, atol=atol, rtol=1e-4)
    if wrt:
        cot = np.asarray(RNG.randn(*ref.shape), np.float32)
        grads = ms.grad(lambda *a: (ms_fn(*a) * Tensor(cot)).sum(), grad_position=tuple(wrt))(*targs)
        for k, g in zip(wrt, grads if len(wrt) > 1 else (grads,)):
            np.testing.assert_allclose(g.asnumpy(), num_grad(np_fn, list(args), k, cot), atol=1e-4, rtol=1e-3,
                                       err_msg=f"gradient w.r.t. argument {k}")


_erf = np.vectorize(math.erf)


def np_gelu(x):
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def np_gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def np_layer_norm(x, w, b, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def np_cross_entropy(logits, target, reduction="mean"):
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    valid = target != -100
    nll = np.where(valid, -logp[np.arange(len(target)), np.where(valid, target, 0)], 0.0)
    return {"none": nll, "sum": nll.sum(), "mean": nll.sum() / valid.sum()}[reduction]


def split_transposed(split_fn):
    """split x (6, 9) into columns [2, 3, 4] and flatten each part transposed: non-contiguous grads."""
    return lambda x: ops.concat([p.T.reshape(-1) for p in split_fn(x)])


def np_split_transposed(x):
    return np.concatenate([p.T.reshape(-1) for p in np.split(x, [2, 5], axis=1)])


# -- index-only replacements -------------------------------------------------------------------

@pytest.mark.parametrize("args,kw,ref", [
    ((5,), {}, np.arange(5)),
    ((2, 9, 3), {}, np.arange(2, 9, 3)),
    ((0, 8, 2), {"dtype": ms.float32}, np.arange(0, 8, 2, dtype=np.float32)),
    ((Tensor(4),), {}, np.arange(4)),
    ((0.0, 1.0, 0.25), {}, np.arange(0.0, 1.0, 0.25, dtype=np.float32)),
])
def test_arange(args, kw, ref):
    out = mc.arange(*args, **kw).asnumpy()
    np.testing.assert_array_equal(out, ref)
    assert out.dtype == (np.int64 if ref.dtype.kind == "i" else np.float32)


@pytest.mark.parametrize("steps", [1, 2, 5, 7, 16, 48])
def test_linspace_is_torch_float32_formula(steps):
    out = mc.linspace(0, 47, steps).asnumpy()
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, side.torch_linspace(0, 47, steps))
    np.testing.assert_allclose(out, np.linspace(0, 47, steps), atol=1e-5)
    assert out[0] == 0 and (steps == 1 or out[-1] == 47)   # the two-sided formula hits both ends


def test_ones_zeros_like():
    x = Tensor(f32(2, 3))
    np.testing.assert_array_equal(mc.ones_like(x).asnumpy(), np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(mc.zeros_like(x).asnumpy(), np.zeros((2, 3), np.float32))
    assert mc.ones_like(x, dtype=ms.int64).dtype == ms.int64


def test_repeat_interleave():
    g = np.array([[1, 4, 6], [2, 2, 4]], np.int64)
    np.testing.assert_array_equal(mc.repeat_interleave(Tensor(g[:, 1] * g[:, 2]), Tensor(g[:, 0])).asnumpy(),
                                  np.repeat(g[:, 1] * g[:, 2], g[:, 0]))
    np.testing.assert_array_equal(mc.repeat_interleave(Tensor(g), 2, dim=0).asnumpy(), np.repeat(g, 2, 0))
    np.testing.assert_array_equal(mc.repeat_interleave(Tensor(g), 2).asnumpy(), np.repeat(g, 2))
    x = f32(3, 4)
    check(lambda a: mc.repeat_interleave(a, 2, dim=0), lambda a: np.repeat(a, 2, 0), [x], wrt=(0,))
    check(lambda a: mc.repeat_interleave(a, Tensor(np.array([1, 0, 3])), dim=0), lambda a: np.repeat(a, [1, 0, 3], 0),
          [x], wrt=(0,))


def test_argsort_is_stable():
    a = np.array([3, 1, 2, 1, 0, 5], np.int64)
    np.testing.assert_array_equal(mc.argsort(Tensor(a)).asnumpy(), np.argsort(a, kind="stable"))
    np.testing.assert_array_equal(mc.argsort(Tensor(a), descending=True).asnumpy(), np.argsort(-a, kind="stable"))


# -- differentiable replacements ---------------------------------------------------------------

def test_stack_and_outer():
    a, b = f32(2, 3), f32(2, 3)
    check(lambda x, y: mc.stack([x, y], dim=1), lambda x, y: np.stack([x, y], 1), [a, b], wrt=(0, 1))
    check(mc.outer, np.outer, [f32(4), f32(3)], wrt=(0, 1))


def test_split_gradient_with_noncontiguous_output_grads():
    x = f32(6, 9)
    check(split_transposed(lambda a: mc.split(a, [2, 3, 4], dim=1)), np_split_transposed, [x], wrt=(0,))
    check(lambda a: ops.concat([p.reshape(-1) for p in mc.split(a, 3, dim=0)]), lambda a: a.reshape(-1), [x], wrt=(0,))
    for got, ref in zip(mc.split(Tensor(x), Tensor(np.array([2, 3, 4])), dim=1), np.split(x, [2, 5], axis=1)):
        np.testing.assert_array_equal(got.asnumpy(), ref)


def test_pad():
    x = f32(2, 3)
    check(lambda a: mc.pad(a, (1, 2), value=0.5), lambda a: np.pad(a, ((0, 0), (1, 2)), constant_values=0.5), [x],
          wrt=(0,))
    check(lambda a: mc.pad(a, (0, 1, 2, 0)), lambda a: np.pad(a, ((2, 0), (0, 1))), [x], wrt=(0,))
    i = np.array([[3, 5, 9]], np.int64)
    np.testing.assert_array_equal(mc.pad(Tensor(i), (0, 1), value=-100).asnumpy(),
                                  np.pad(i, ((0, 0), (0, 1)), constant_values=-100))


def test_gelu_functions_cells_and_mindone_activation():
    x = f32(3, 5) * 2
    check(mc.gelu, np_gelu, [x], wrt=(0,))
    check(lambda a: mc.gelu(a, approximate="tanh"), np_gelu_tanh, [x], wrt=(0,))
    check(mc.GELU(), np_gelu, [x], wrt=(0,))
    from mindone.transformers.activations import ACT2FN
    check(ACT2FN["gelu_pytorch_tanh"], np_gelu_tanh, [x], wrt=(0,))


def test_dropout():
    x = Tensor(f32(3, 4))
    assert mc.dropout(x, p=0.0, training=True) is x and mc.dropout(x, p=0.3, training=False) is x
    y = mc.dropout(Tensor(np.ones((200, 50), np.float32)), p=0.5, training=True).asnumpy()
    assert set(np.unique(y)) <= {0.0, 2.0} and 0.4 < (y == 0).mean() < 0.6


def test_embedding_and_padding_idx():
    w, ids = f32(7, 4), np.array([[1, 3, 3], [0, 6, 2]], np.int64)
    check(lambda t: mc.embedding(Tensor(ids), t), lambda t: t[ids], [w], wrt=(0,))
    np.testing.assert_array_equal(mc.embedding(Tensor(ids), Tensor(w), padding_idx=2).asnumpy(), w[ids])
    g = ms.grad(lambda t: mc.embedding(Tensor(ids), t, padding_idx=2).sum())(Tensor(w)).asnumpy()
    ref = np.zeros_like(w)
    np.add.at(ref, ids[ids != 2], 1.0)   # the padding row gets no gradient
    np.testing.assert_array_equal(g, ref)
    cell = mc.Embedding(10, 4)
    assert isinstance(cell, mint.nn.Embedding) and [p.name for p in cell.get_parameters()] == ["weight"]
    np.testing.assert_array_equal(cell(Tensor(np.array([1, 9]))).asnumpy(), cell.weight.asnumpy()[[1, 9]])


def test_layer_norm_function_and_cell():
    x, w, b = f32(3, 8), f32(8), f32(8)
    check(lambda a, c, d: mc.layer_norm(a, (8,), c, d, 1e-6), np_layer_norm, [x, w, b], wrt=(0, 1, 2))
    cell = mc.LayerNorm(8, eps=1e-6)
    assert isinstance(cell, mint.nn.LayerNorm) and sorted(p.name for p in cell.get_parameters()) == ["bias", "weight"]
    cell.weight.set_data(Tensor(w))
    cell.bias.set_data(Tensor(b))
    check(cell, lambda a: np_layer_norm(a, w, b), [x], wrt=(0,))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_function_and_cell(reduction):
    logits, target = f32(6, 11) * 3, np.array([1, -100, 10, 0, -100, 4], np.int64)
    ref = lambda a: np_cross_entropy(a, target, reduction)  # noqa: E731
    check(lambda a: mc.cross_entropy(a, Tensor(target), reduction=reduction), ref, [logits], wrt=(0,))
    cell = mc.CrossEntropyLoss(reduction=reduction)
    check(lambda a: cell(a, Tensor(target)), ref, [logits], wrt=(0,))


def test_conv3d_patch_embedding_and_padding():
    """Qwen-VL's patch embedding: kernel == stride == the input patch, one output voxel per patch."""
    x, w, b = f32(5, 3, 2, 4, 4), f32(6, 3, 2, 4, 4), f32(6)
    conv = mc.Conv3d(3, 6, kernel_size=(2, 4, 4), stride=(2, 4, 4), bias=True)
    assert isinstance(conv, mint.nn.Conv3d) and sorted(p.name for p in conv.get_parameters()) == ["bias", "weight"]

    conv.weight.set_data(Tensor(w))
    conv.bias.set_data(Tensor(b))
    check(lambda xx: conv(xx).reshape(5, 6), lambda xx: xx.reshape(5, -1) @ w.reshape(6, -1).T + b, [x], wrt=(0,))
    gw, gb = ms.grad(lambda xx: conv(xx).sum(), grad_position=None, weights=conv.trainable_params())(Tensor(x))
    np.testing.assert_allclose(gw.asnumpy(), np.broadcast_to(x.sum(0), w.shape), atol=1e-4)
    np.testing.assert_allclose(gb.asnumpy(), np.full(6, 5.0), atol=1e-5)
    x2, w2 = f32(1, 2, 4, 6, 6), f32(3, 2, 2, 3, 3)
    conv = mc.Conv3d(2, 3, kernel_size=(2, 3, 3), stride=1, padding=1, bias=False)
    conv.weight.set_data(Tensor(w2))
    xp = np.pad(x2, ((0, 0), (0, 0), (1, 1), (1, 1), (1, 1)))
    ref = np.zeros((1, 3, 5, 6, 6))
    for d, i, j in np.ndindex(5, 6, 6):
        ref[0, :, d, i, j] = np.tensordot(w2, xp[0, :, d:d + 2, i:i + 3, j:j + 3], axes=4)
    np.testing.assert_allclose(conv(Tensor(x2)).asnumpy(), ref, atol=1e-4)


def test_tensor_repeat_and_clone():
    x = f32(2, 3)
    check(lambda a: a.repeat(2, 1), lambda a: np.tile(a, (2, 1)), [x], wrt=(0,))
    check(lambda a: a.repeat((1, 3)), lambda a: np.tile(a, (1, 3)), [x], wrt=(0,))
    check(lambda a: a.repeat(2, 1, 1), lambda a: np.tile(a, (2, 1, 1)), [x], wrt=(0,))
    check(lambda a: a.clone() * 2, lambda a: a * 2, [x], wrt=(0,))
    t = Tensor(x)
    c = t.clone()
    c[0, 0] = 99.0   # a clone never aliases its source
    assert c is not t and t.asnumpy()[0, 0] == x[0, 0]


def test_deepstack_process():
    h, e = f32(2, 7, 5), f32(5, 5)
    m = np.zeros((2, 7), bool)
    m[0, 2:5] = m[1, 1:3] = True

    def ref(a, c):
        out = a.copy()
        out[m] += c
        return out

    check(lambda a, c: mc._deepstack_process(None, a, Tensor(m), c), ref, [h, e], wrt=(0, 1))


def test_get_rope_index_methods_call_rope_index():
    """The patched methods keep mindone's signatures and pass the config's ids and options."""
    from mindone.transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
    from mindone.transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel
    img, vid = np.array([[1, 4, 4]]), np.array([[2, 4, 4]])   # a video of 2 frames of 4 merged tokens
    frame = [VISION_START] + [VIDEO] * 4 + [VISION_END]
    videos = {"25": [VISION_START] + [VIDEO] * 8 + [VISION_END], "3": [20] + frame + [21] + frame}
    for cls, kind, extra in ((Qwen2_5_VLModel, "25", (Tensor(np.array([2.0])),)), (Qwen3VLModel, "3", ())):
        ids = np.array([[12] + videos[kind] + [13, VISION_START] + [IMAGE] * 4 + [VISION_END, 14]])
        mask = np.ones_like(ids)
        cfg = tiny_config(kind)
        fake = type("Fake", (), {"config": cfg})()
        pos, deltas = cls.get_rope_index(fake, Tensor(ids), Tensor(img), Tensor(vid), *extra,
                                         attention_mask=Tensor(mask))
        opts = side.rope_options("qwen2_5_vl" if kind == "25" else "qwen3_vl", cfg.vision_config)
        ref = side.rope_index(ids, mask, img, vid, spatial_merge_size=2, image_token_id=IMAGE, video_token_id=VIDEO,
                              vision_start_token_id=VISION_START,
                              **dict(opts, **({"second_per_grid_ts": [2.0]} if kind == "25" else {})))
        np.testing.assert_array_equal(pos.asnumpy(), ref[0])
        np.testing.assert_array_equal(deltas.asnumpy(), ref[1])
        if kind == "25":   # frame t at t * int(2.0 s) * 2 tokens per second
            assert pos.asnumpy()[0, 0, 2:10].tolist() == [2] * 4 + [6] * 4


def test_vision_cos_sin_uses_mindspore_cos_sin():
    a = f32(6, 4)
    cos, sin = mc.vision_cos_sin(a)
    emb = Tensor(np.concatenate([a, a], -1))
    np.testing.assert_array_equal(cos.asnumpy(), emb.cos().asnumpy())
    np.testing.assert_array_equal(sin.asnumpy(), emb.sin().asnumpy())


# -- pins of the CPU behaviours worked around (fail when MindSpore changes) ----------------------

MISSING = {
    "mint.arange": lambda x: mint.arange(3),
    "mint.linspace": lambda x: mint.linspace(0, 1, 3),
    "mint.ones_like": lambda x: mint.ones_like(x),
    "mint.zeros_like": lambda x: mint.zeros_like(x),
    "mint.stack": lambda x: mint.stack([x, x]),
    "mint.outer": lambda x: mint.outer(x[0], x[0]),
    "mint.repeat_interleave": lambda x: mint.repeat_interleave(x, 2, 0),
    "mint.argsort": lambda x: mint.argsort(x),
    "F.pad": lambda x: mint.nn.functional.pad(x, (1, 0)),
    "F.gelu": lambda x: mint.nn.functional.gelu(x),
    "F.dropout(p=0)": lambda x: mint.nn.functional.dropout(x, 0.0, False),
    "F.embedding": lambda x: mint.nn.functional.embedding(Tensor(np.array([0, 1])), x),
    "F.layer_norm": lambda x: mint.nn.functional.layer_norm(x, (3,)),
    "F.cross_entropy": lambda x: mint.nn.functional.cross_entropy(x, Tensor(np.array([0, 1]))),
    "mint.nn.Conv3d": lambda x: mint.nn.Conv3d(1, 1, 1)(Tensor(np.ones((1, 1, 1, 1, 1), np.float32))),
    "Tensor.repeat": lambda x: mc.original(Tensor, "repeat")(x, 2, 1),
    "Tensor.clone": lambda x: mc.original(Tensor, "clone")(x),
    "Tensor.masked_fill_ (mindone's text-only get_rope_index)": lambda x: x.masked_fill_(x > 0, 1.0),
}


@pytest.mark.parametrize("name", sorted(MISSING))
def test_cpu_kernel_still_missing(name):
    """Each replaced op still fails on CPU; when one passes, its replacement can go."""
    with pytest.raises(RuntimeError):
        MISSING[name](Tensor(f32(2, 3))).asnumpy()


def test_cpu_mint_split_backward_still_wrong():
    """mint.split (split_view) back-propagates non-contiguous output grads wrongly."""
    x, cot = f32(6, 9), RNG.randn(54).astype(np.float32)
    f = split_transposed(lambda a: mint.split(a, [2, 3, 4], dim=1))
    g = ms.grad(lambda a: (f(a) * Tensor(cot)).sum())(Tensor(x)).asnumpy()
    assert np.abs(g - num_grad(np_split_transposed, [x], 0, cot)).max() > 1e-2, \
        "mint.split backward is right now: mindone_cpu.split can go"


def test_cpu_empty_reduction_still_garbage():
    """sum / any of an EMPTY tensor return uninitialised memory (why get_rope_index is numpy)."""
    sums, anys = set(), set()
    for _ in range(4):
        _ = Tensor(np.full((512,), 7, np.int64)) * 3
        sums.add(int(Tensor(np.zeros((0,), np.int64)).sum().asnumpy()))
        anys.add(bool(Tensor(np.zeros((0,), np.bool_)).any().asnumpy()))
    assert sums != {0} or anys != {False}, "empty-tensor reductions are right now"


def test_cpu_nd_bool_mask_getitem_still_wrong():
    """x[mask, :] with a 2-d bool mask has the wrong shape or raises (why _deepstack_process is replaced)."""
    h, m = f32(2, 7, 5), RNG.rand(2, 7) > 0.5
    try:
        out = Tensor(h)[Tensor(m), :]
        wrong = tuple(out.shape) != h[m, :].shape or not np.allclose(out.asnumpy(), h[m, :])
    except (RuntimeError, ValueError, IndexError):
        wrong = True
    assert wrong, "N-d bool-mask getitem works now"


def test_cpu_inplace_ops_still_noop():
    t = Tensor(np.zeros(3, np.float32))
    t.add_(1.0)
    t.mul_(2.0)
    assert float(t.asnumpy().sum()) == 0.0, "in-place add_ / mul_ work now"
    b = Tensor(np.ones((2, 3), np.float32)) * 1.0
    b[:, 1].copy_(ops.zeros(2, ms.float32))
    assert float(b.asnumpy().sum()) == 6.0, "copy_ into a non-contiguous view works now"


def test_new_zeros_torch_style_still_refused_and_replaced():
    """Qwen3-VL's joint image + video deepstack calls ``new_zeros(n, d)`` with n a 0-d Tensor (torch's way):
    MindSpore reads d as a dtype and raises; the replacement gives zeros of (n, d) in the tensor's dtype."""
    x = Tensor(f32(2, 3))
    with pytest.raises(TypeError):
        mc.original(Tensor, "new_zeros")(x, Tensor(np.array(4)), 3)
    z = x.new_zeros(Tensor(np.array(4)), 3)
    assert tuple(z.shape) == (4, 3) and z.dtype == ms.float32 and not z.asnumpy().any()
    assert tuple(x.new_zeros((2, 5), ms.int64).shape) == (2, 5) and x.new_zeros((2, 5), ms.int64).dtype == ms.int64


def test_cpu_identity_still_aliases():
    x = Tensor(f32(3))
    assert ops.identity(x) is x, "ops.identity copies now"


# -- apply / remove ----------------------------------------------------------------------------

def _snapshot():
    import importlib
    mods = {n: dict(vars(importlib.import_module(n))) for n in mc.MODULES}
    from mindone.transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as q25
    from mindone.transformers.models.qwen3_vl import modeling_qwen3_vl as q3
    owners = (Tensor, q25.Qwen2_5_VLModel, q3.Qwen3VLModel, q3.Qwen3VLTextModel)
    return mods, {(o, k): o.__dict__.get(k) for o in owners for k in ("repeat", "clone", "new_zeros",
                                                                       "get_rope_index", "_deepstack_process")}


def test_apply_is_narrow_idempotent_and_reversible():
    from mindone.transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as q25
    from mindone.transformers.models.qwen3_vl import modeling_qwen3_vl as q3
    assert mc.is_applied() and mc.apply() is True
    n = len(mc._SAVED)
    assert mc.apply() is True and len(mc._SAVED) == n   # idempotent
    assert q25.mint.arange is mc.arange and q25.F.pad is mc.pad and q25.mint.nn.Conv3d is mc.Conv3d
    assert q3.mint.nn.LayerNorm is mc.LayerNorm and q3.mint.split is mc.split and q3.F.pad is mc.pad
    assert q25.mint.cat is mint.cat and q25.mint.nn.Linear is mint.nn.Linear   # the rest delegates
    assert mint.arange is not mc.arange and mint.nn.functional.pad is not mc.pad   # mindspore.mint untouched
    assert Tensor.repeat is mc._tensor_repeat and q3.Qwen3VLTextModel._deepstack_process is mc._deepstack_process
    try:
        mc.remove()
        assert not mc.is_applied() and q25.mint is mint and q25.F is mint.nn.functional
        before = _snapshot()
        mc.apply()
        mc.remove()
        mc.remove()   # a no-op
        after = _snapshot()
        assert after[0].keys() == before[0].keys()
        for name in before[0]:
            changed = [k for k in before[0][name] if after[0][name].get(k) is not before[0][name][k]]
            assert not changed, (name, changed)
        assert all(after[1][k] is v for k, v in before[1].items())
        with pytest.raises(RuntimeError):
            Tensor(f32(2)).repeat(2)   # the original again
    finally:
        mc.apply()


def test_apply_is_a_noop_off_cpu(monkeypatch):
    from mindone.transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as q25
    mc.remove()
    try:
        monkeypatch.setattr(ms, "get_context", lambda key: "Ascend" if key == "device_target" else None)
        assert not mc.needed() and mc.apply() is False and not mc.is_applied()
        assert q25.mint is mint and "repeat" not in Tensor.__dict__
    finally:
        monkeypatch.undo()
        mc.apply()
    assert mc.needed() and mc.is_applied()


@pytest.mark.parametrize("kind", ["25", "3"])
@pytest.mark.slow
def test_sdpa_attention_needs_no_more_patches(kind):
    """attn_implementation 'sdpa' runs on CPU with the same patches and gives eager's loss."""
    from mindone.transformers import Qwen2_5_VLForConditionalGeneration, Qwen3VLForConditionalGeneration
    cfg, model = tiny_model(kind)
    sdpa_cfg = tiny_config(kind)
    for c in (sdpa_cfg, sdpa_cfg.text_config, sdpa_cfg.vision_config):
        c._attn_implementation = "sdpa"
    sdpa = (Qwen2_5_VLForConditionalGeneration if kind == "25" else Qwen3VLForConditionalGeneration)(sdpa_cfg)
    sdpa.set_train(False)
    for p, q in zip(sdpa.trainable_params(), model.trainable_params()):
        p.set_data(q.data)
    batch = tensors(make_batch(cfg, [(1, 8, 12), None], [(3, 4), (2, 6)], pad_left=True))
    np.testing.assert_allclose(sdpa(**batch).loss.asnumpy(), model(**batch).loss.asnumpy(), rtol=1e-6)


# -- whole tiny models: directional finite differences of the loss -----------------------------

def fd_check(kind, groups, grids, text_lens, eps=1e-2, rtol=1e-2):
    """For each parameter-name prefix in ``groups``: the loss's directional derivative along
    d = unit(random) + unit(grad) by central differences equals <grad, d> (a wrong gradient
    shifts it by a fraction of |grad|)."""
    cfg, model = tiny_model(kind)
    batch = tensors(make_batch(cfg, grids, text_lens))
    params = model.trainable_params()
    loss = lambda: model(**batch).loss  # noqa: E731
    _, grads = ms.value_and_grad(loss, None, params)()
    rng = np.random.RandomState(0)
    for prefix in groups:
        pg = [(p, g.asnumpy().astype(np.float64)) for p, g in zip(params, grads) if p.name.startswith(prefix)]
        assert pg, prefix
        base = [p.asnumpy().copy() for p, _ in pg]
        r = [rng.randn(*v.shape) for v in base]
        nr = math.sqrt(sum((v ** 2).sum() for v in r))
        ng = math.sqrt(sum((g ** 2).sum() for _, g in pg))
        assert ng > 0, f"{prefix}: zero gradient"
        dirs = [(a / nr + g / ng).astype(np.float32) for a, (_, g) in zip(r, pg)]
        analytic = sum(float((g * d).sum()) for (_, g), d in zip(pg, dirs))
        vals = []
        for sign in (1, -1):
            for (p, _), v, d in zip(pg, base, dirs):
                p.set_data(Tensor(v + sign * eps * d))
            vals.append(float(loss().asnumpy()))
        for (p, _), v in zip(pg, base):
            p.set_data(Tensor(v))
        fd = (vals[0] - vals[1]) / (2 * eps)
        assert abs(fd - analytic) <= rtol * max(abs(fd), abs(analytic)) + 1e-4, (prefix, analytic, fd)


@pytest.mark.slow
def test_qwen25_whole_model_gradients_finite_difference():
    fd_check("25", ["model.visual.patch_embed.", "model.visual.blocks.0.", "model.visual.blocks.1.",
                    "model.visual.merger.", "model.language_model.embed_tokens.", "model.language_model.layers.0.",
                    "model.language_model.norm.", "lm_head."],
             [(1, 8, 12), (1, 4, 4), None], [(3, 4), (2, 6), (5, 2)])


@pytest.mark.slow
def test_qwen3_whole_model_gradients_finite_difference():
    fd_check("3", ["model.visual.patch_embed.", "model.visual.pos_embed.", "model.visual.blocks.0.",
                   "model.visual.deepstack_merger_list.0.", "model.visual.merger.", "model.language_model.layers.0.",
                   "lm_head."],
             [(1, 8, 12), (1, 4, 4), None], [(3, 4), (2, 6), (5, 2)])


@pytest.mark.slow
def test_mindone_decoder_layer_still_does_not_compile(tmp_path):
    """Why the compiled Qwen-VL chunks run the graph-ready forwards of ``qwen_vl/graph.py`` rather than mindone's own
    ``construct`` methods (docs/training.md): mindone's decoder layer does not compile under ``mindspore.jit``. Fails,
    saying so, the day it does."""
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(here)))   # the checkout
    run = subprocess.run([sys.executable, os.path.join(here, "mindone_jit_probe.py")], capture_output=True,
                         text=True, timeout=600, env=env, cwd=tmp_path)   # MindSpore writes rank_0/om/ there
    out = [l for l in run.stdout.splitlines() if l.startswith(("COMPILED", "FAILED"))]
    assert out, run.stdout[-2000:] + run.stderr[-2000:]
    assert out[-1] != "COMPILED", ("mindone's decoder layer compiles now: the Qwen-VL chunks' graph_body could call "
                                   "mindone's layers (qwen_vl/graph.py)")
    assert "Tensor.transpose" in out[-1], out[-1]
