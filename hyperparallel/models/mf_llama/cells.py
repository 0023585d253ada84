"""MindSpore side of :mod:`.adapter`: a chunk of MindFormers' ``LlamaForCausalLM`` and its side inputs."""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import nn, ops, Tensor

from ..cells import MicroTensors


class LlamaTensors(MicroTensors):
    """The micro-batch's tensors plus what every Llama chunk reads: the text token ids as one
    (1, tokens) row (samples may hold different numbers of text tokens; the embedding is a
    per-token lookup, the merge index places each row into its sample), the batch size and
    the valid-position mask (padding after the text is 0)."""

    def __init__(self, mb, loss_scale: float):
        super().__init__(mb, loss_scale)
        B = self.batch_size = len(mb.images_per_sample)
        self.seq_len = int(mb.merge_index.shape[0]) // B
        self.text_2d = Tensor(mb.text_ids.reshape(1, -1))
        self.valid = Tensor((mb.merge_index.reshape(B, self.seq_len) > 0).astype(np.float32))


class LlamaChunk(nn.Cell):
    """Decoder layers ``[start, stop)`` of a built ``LlamaForCausalLM`` (``net``), plus the token
    embedding and image splice (first chunk) or final norm, LM head and loss (last chunk).

    Every chunk recomputes the rotary frequencies (``freqs_mgr``) and the causal/padding mask
    (``casual_mask``, MindFormers' spelling) from the micro-batch: they hold no parameters.
    The Cells are the network's own (shared, not copied); parameter names stay MindFormers'."""

    def __init__(self, net, start: int, stop: int, num_layers: int):
        super().__init__(auto_prefix=False)
        names = {id(p): p.name for p in net.get_parameters()}
        body = net.model
        self.first, self.last = start == 0, stop == num_layers
        self.hidden = int(body.hidden_size)
        self._aux = (body.freqs_mgr, body.casual_mask)   # tuple: not registered as sub-cells
        if self.first:
            self.embed = body.tok_embeddings
        self.layers = nn.CellList(list(body.layers)[start:stop])
        if self.last:
            self.norm = body.norm_out
            self.head = net.lm_head
        for p in self.get_parameters():   # attaching renamed them: restore MindFormers' names
            p.name = names[id(p)]

    def forward(self, x, mb):
        return self.graph_body(x, *self.graph_args(mb))

    def graph_args(self, mb) -> tuple:
        """The side inputs of :meth:`graph_body`: text ids and merge index (first chunk), the valid-position
        mask (every chunk), targets, mask and loss scale (last chunk); None where the chunk reads nothing."""
        first = (mb.text_2d, mb.merge_index) if self.first else (None, None)
        last = (mb.onehot, mb.mask, mb.loss_scale_t) if self.last else (None, None, None)   # a tensor: see cells
        return first + (mb.valid,) + last

    def graph_body(self, x, text_2d, merge_index, valid, onehot, mask, loss_scale):
        """The chunk's computation on tensors only (what ``mindspore.jit`` compiles); batch size and sequence
        length come from the valid-position mask's shape."""
        freqs_mgr, casual_mask = self._aux
        B, S = valid.shape
        if self.first:
            text = self.embed(text_2d).reshape(-1, self.hidden)
            table = ops.concat([ops.zeros((1, self.hidden), ms.float32), x, text], 0)
            x = ops.gather(table, merge_index, 0).reshape(B, S, self.hidden)
        freqs = freqs_mgr(S)
        attn_mask = casual_mask(masks=valid)
        for layer in self.layers:
            x = layer(x, freqs, attn_mask)
        if self.last:
            logits = self.head(self.norm(x)).astype(ms.float32)
            logp = ops.log_softmax(logits, -1)
            ce = -(logp * onehot).sum(-1)
            x = (ce * mask).sum() / mask.sum() * loss_scale
        return x
