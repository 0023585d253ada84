"""A user adapter (``model.adapter: wrong_boundary:WrongBoundary``) whose boundary spec is wrong:
the tiny MLLM with one sequence position too many in the LLM's boundary shape."""
from hyperparallel.models.base import TensorSpec
from hyperparallel.models.tiny_mllm.adapter import LLM, TinyMLLM


class WrongBoundary(TinyMLLM):
    family = "wrong_boundary"

    def boundary(self, region, stop, micro_batch):
        spec = super().boundary(region, stop, micro_batch)
        if region == LLM:
            return TensorSpec((spec.shape[0], spec.shape[1] + 1) + spec.shape[2:], spec.dtype)
        return spec
