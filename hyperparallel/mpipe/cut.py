"""Cut: split each region into chunks and say which devices hold each chunk."""
from __future__ import annotations

from typing import List

from .errors import SpecError
from .ir import Chunk
from .orders import device_of
from .profile import ModelProfile
from .schedule import Pipe, Place, Schedule, Transpose


def split_layers(layers: int, parts: int) -> List[int]:
    """Contiguous, as even as possible; earlier chunks take the remainder."""
    base, extra = divmod(layers, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def cut(profile: ModelProfile, schedule: Schedule, P: int, V: int) -> List[Chunk]:
    """The pipelined region gets P*V chunks (loop or V-shape placement of its order); other regions one chunk."""
    chunks: List[Chunk] = []
    for i, (name, sk) in enumerate(schedule.parts):
        region = profile.region(name)
        if isinstance(sk, Pipe):
            n = P * V
            if region.layers < n:
                raise SpecError(f"mpipe.profile.regions[{i}].layers",
                                f"{name!r} has {region.layers} layers, cannot cut into pipeline_stage x "
                                f"pp_interleave_num = {P} x {V} = {n} chunks")
            start = 0
            for c, size in enumerate(split_layers(region.layers, n)):
                chunks.append(Chunk(name, c, start, start + size, (device_of(sk.order, c, P),)))
                start += size
        elif isinstance(sk, Place):
            if sk.device >= P:
                raise SpecError(f"schedule.{name}.device",
                                f"device {sk.device} out of range; allowed: 0..{P - 1} (pipeline_stage={P})")
            chunks.append(Chunk(name, 0, 0, region.layers, (sk.device,)))
        elif isinstance(sk, Transpose):
            chunks.append(Chunk(name, 0, 0, region.layers, tuple(range(P))))
    return chunks
