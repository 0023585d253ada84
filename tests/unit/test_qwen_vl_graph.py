"""Compiled Qwen-VL chunks (``mpipe.compile: jit``, :mod:`hyperparallel.models.qwen_vl.graph`): one decoder layer and
one vision block of the tiny Qwen2.5-VL / Qwen3-VL under ``mindspore.jit`` give mindone's eager outputs and gradients;
every chunk's compiled tensor-only body gives its eager ``forward`` (outputs, input and weight gradients); the adapter
says which cases compile and why the others run eager (naming the key); a one-device runtime of the tiny Qwen2.5-VL
trains compiled exactly like eager.

mindone's own layers still do not compile (test_mindone_cpu.py's probe): these forwards are the graph-ready ones."""
import os

os.environ.setdefault("GLOG_v", "3")

import numpy as np
import pytest

pytest.importorskip("mindone")

import mindspore as ms  # noqa: E402
from mindspore import Tensor  # noqa: E402

from test_mindone_cpu import tiny_model  # noqa: E402  (sets up CPU and the compatibility layer)
from hyperparallel.models.qwen_vl import graph as G  # noqa: E402
from hyperparallel.models.qwen_vl.cpu import vision_cos_sin  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = {"qwen2_5_vl": os.path.join(ROOT, "recipes", "qwen2_5_vl_tiny.yaml"),
           "qwen3_vl": os.path.join(ROOT, "recipes", "qwen3_vl_tiny.yaml")}
KINDS = {"qwen2_5_vl": "25", "qwen3_vl": "3"}


class _One(ms.nn.Cell):
    """One mindone cell and a graph function of it as a Cell method (MindSpore parses a method's source)."""

    def __init__(self, cell, fn, *const):
        super().__init__(auto_prefix=False)
        self.cell, self.fn, self.const = cell, fn, const

    def body(self, x, mask, cos, sin):
        return self.fn(self.const[0], self.cell, self.const[1], x, mask, cos, sin)


def _grads(f, x, params):
    gx, gw = ms.grad(lambda x: (f(x) * Tensor(np.linspace(-1, 1, int(np.prod(f(x).shape)), dtype=np.float32)
                                             .reshape(f(x).shape))).sum(), grad_position=0, weights=params)(x)
    return gx.asnumpy(), [g.asnumpy() for g in gw]


def _agree(eager, compiled, params, x, atol=2e-5):
    """Outputs equal; input and every weight gradient (of a weighted sum) equal and not all zero."""
    np.testing.assert_allclose(compiled(x).asnumpy(), eager(x).asnumpy(), atol=atol, rtol=1e-5)
    ex, ew = _grads(eager, x, params)
    cx, cw = _grads(compiled, x, params)
    np.testing.assert_allclose(cx, ex, atol=atol, rtol=1e-4)
    assert np.abs(ex).max() > 0
    for p, e, c in zip(params, ew, cw):
        assert np.abs(e).max() > 0, p.name
        np.testing.assert_allclose(c, e, atol=atol, rtol=1e-4, err_msg=p.name)


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_one_decoder_layer_compiles_and_matches_mindone_eager(kind):
    cfg, net = tiny_model(KINDS[kind])
    lm = net.model.language_model
    layer, B, S, D = lm.layers[1], 2, 8, cfg.text_config.hidden_size
    rng = np.random.RandomState(0)
    h = Tensor(rng.randn(B, S, D).astype(np.float32))
    pos = Tensor(np.stack([np.tile(np.arange(S), (B, 1)), rng.randint(0, S, (B, S)), rng.randint(0, S, (B, S))])
                 .astype(np.int64))   # three different M-RoPE rows: the section selection matters
    am = np.ones((B, S), np.int64)
    am[1, :2] = 0   # left padding in sample 1
    from hyperparallel.models.qwen_vl.side import causal_mask
    mask = Tensor(causal_mask(am))
    pe = lm.rotary_emb(h, pos)
    cos, sin = G.text_cos_sin(kind, lm.rotary_emb, h, pos, cfg.text_config.rope_scaling.get("mrope_section"))
    if kind == "qwen2_5_vl":
        def eager(x):
            return layer(x, attention_mask=mask, position_ids=pos[0], position_embeddings=pe)[0]
    else:
        def eager(x):
            return layer(x, attention_mask=mask, position_ids=pos[0], past_key_values=None,
                         cache_position=Tensor(np.arange(S)), position_embeddings=pe)
    graph = ms.jit(_One(layer, G.decoder_layer, kind, cfg.text_config.hidden_act).body)
    names = [p.name for p in layer.trainable_params()]
    _agree(eager, lambda x: graph(x, mask, cos, sin), layer.trainable_params(), h)
    assert [p.name for p in layer.trainable_params()] == names and names[0].startswith("model.language_model.layers.1.")


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_one_vision_block_compiles_and_matches_mindone_eager(kind):
    """Windows of unequal lengths: mindone attends within each (split by cu_seqlens on the host); the graph
    attends over all patches with the block-diagonal mask."""
    cfg, net = tiny_model(KINDS[kind])
    v = cfg.vision_config
    blk, N = net.model.visual.blocks[0], 24
    rng = np.random.RandomState(1)
    h = Tensor(rng.randn(N, v.hidden_size).astype(np.float32))
    cu = np.array([0, 4, 12, 12, 24], np.int32)   # an empty window too (Qwen2.5-VL's padding windows)
    cos, sin = vision_cos_sin(rng.randn(N, v.hidden_size // v.num_heads // 2).astype(np.float32))
    mask = Tensor(G.block_mask(cu))
    assert (G.block_mask(cu)[4:12, 4:12] == 0).all() and (G.block_mask(cu)[:4, 4:] == G.MASKED).all()

    def eager(x):
        return blk(x, cu_seqlens=Tensor(cu), position_embeddings=(cos, sin))
    graph = ms.jit(_One(blk, G.vision_block, kind, v.hidden_act).body)
    _agree(eager, lambda x: graph(x, mask, cos, sin), blk.trainable_params(), h)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from hyperparallel.data.demo import write_demo
    paths = write_demo(str(tmp_path_factory.mktemp("demo")), 8, seed=3)
    return [f"data.{k}={v}" for k, v in sorted(paths.items())]


def _run_config(kind, demo, *sets):
    from hyperparallel.recipe import load_recipe
    from hyperparallel.runconfig import RunConfig
    return RunConfig.from_raw(load_recipe(RECIPES[kind], list(demo) + list(sets)).raw)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_every_chunk_compiles_and_matches_its_eager_forward(kind, demo):
    """Vision [0, 1), [1, 2) (Qwen3-VL: deepstack features packed across the cut) and LLM [0, 2), [2, 4) (the first:
    the image scatter; the last: norm, head and loss times the scale): the compiled body's output and gradients
    (input and weights) equal the eager forward's."""
    rc = _run_config(kind, demo)
    m = rc.model
    assert m.compile_reason("vision") == m.compile_reason("llm") == ""
    t = m.tensors(rc.source().micro_batch(0, 0), 0.5)
    x = m.model_input(t)
    for region, a, b in (("vision", 0, 1), ("vision", 1, 2), ("llm", 0, 2), ("llm", 2, 4)):
        c = m.build_chunk(region, a, b)
        graph, args = ms.jit(c.graph_body), c.graph_args(t)
        assert len(args) == c.graph_body.__code__.co_argcount - 2
        if region == "llm" and b == 4:   # a scalar loss
            out = c.forward(x, t)
            assert abs(float(graph(x, *args).asnumpy()) - float(out.asnumpy())) < 1e-6 and float(out.asnumpy()) > 0
        _agree(lambda x: c.forward(x, t), lambda x: graph(x, *args), c.trainable_params(), x)
        x = c.forward(x, t)


def test_the_adapter_says_which_cases_compile_and_names_the_key_of_those_that_run_eager(demo):
    from hyperparallel.models.qwen_vl.adapter import DTYPE_REASON, LORA_REASON, TP_REASON
    from hyperparallel.commands.train import compile_line
    for kind in RECIPES:
        m = _run_config(kind, demo).model
        assert m.compile_reason("vision") == m.compile_reason("llm") == ""
        assert compile_line(m, "jit") == "compile (mpipe.compile: jit): vision, llm jit"
    m = _run_config("qwen2_5_vl", demo, "parallel_config.model_parallel=2").model
    assert (m.compile_reason("vision"), m.compile_reason("llm")) == ("", TP_REASON)
    assert TP_REASON.startswith("parallel_config.model_parallel")
    m = _run_config("qwen2_5_vl", demo, "model.model_config.dtype=float16",
                    "runner_wrapper={scale_sense: 1024}").model
    want = DTYPE_REASON.format(key="model.model_config.dtype", dtype="float16")
    assert m.compile_reason("vision") == m.compile_reason("llm") == want
    assert compile_line(m, "jit") == f"compile (mpipe.compile: jit): vision, llm eager ({want})"
    m = _run_config("qwen2_5_vl", demo, "model.lora={r: 2, target_modules: [q_proj]}").model
    assert m.compile_reason("llm") == LORA_REASON and LORA_REASON.startswith("model.lora")
