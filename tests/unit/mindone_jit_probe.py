"""Run by tests/unit/test_mindone_cpu.py in a fresh process (a failing compile after other graphs may hang,
docs/training.md): can ``mindspore.jit`` compile one decoder layer of mindone's tiny Qwen2.5-VL (test_mindone_cpu's,
eager it runs) with its side inputs and rotary table as graph inputs? Prints ``COMPILED`` or ``FAILED: <MindSpore's message>``."""
import os
import sys

os.environ.setdefault("GLOG_v", "3")

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402

from test_mindone_cpu import tiny_model  # noqa: E402  (tests/unit/ is this script's folder; CPU set up there)

cfg, net = tiny_model("25")
lm = net.model.language_model
layer, S, D = lm.layers[0], 8, cfg.text_config.hidden_size
h = ms.Tensor(np.random.RandomState(0).randn(1, S, D).astype(np.float32))
pos = ms.Tensor(np.tile(np.arange(S, dtype=np.int64), (3, 1, 1)))
mask = ms.Tensor(np.triu(np.full((S, S), -1e9, np.float32), 1)[None, None])
cos, sin = lm.rotary_emb(h, pos)
assert layer(h, attention_mask=mask, position_ids=pos[0], position_embeddings=(cos, sin))[0].shape == h.shape


def body(h, mask, pos0, cos, sin):
    return layer(h, attention_mask=mask, position_ids=pos0, position_embeddings=(cos, sin))[0]


try:
    ms.jit(body)(h, mask, pos[0], cos, sin)
    print("COMPILED")
except Exception as e:   # MindSpore's compile errors: RuntimeError, ValueError, TypeError
    print("FAILED: " + " ".join(str(e).split())[:2000])
sys.stdout.flush()
