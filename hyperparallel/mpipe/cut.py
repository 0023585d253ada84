"""Cut: split each region into chunks and say which devices hold each chunk."""
from __future__ import annotations

from typing import List

from ..errors import SpecError, is_whole
from .ir import Chunk
from .orders import device_of
from .profile import ModelProfile
from .schedule import Pipe, Place, Schedule, Transpose


def split_layers(layers: int, parts: int) -> List[int]:
    """Contiguous, as even as possible; earlier chunks take the remainder."""
    base, extra = divmod(layers, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def pipe_layers(region: str, layers: int, given, P: int, V: int, where: str) -> List[int]:
    """Layers of every chunk of a pipelined region: ``given`` (the pipe's ``layers``, e.g. from
    MindFormers' ``offset``) checked against P x V and the region, else the even split."""
    n = P * V
    if given is None:
        if layers < n:
            raise SpecError(where, f"{region!r} has {layers} layers, cannot cut into pipeline_stage x "
                                   f"pp_interleave_num = {P} x {V} = {n} chunks")
        return split_layers(layers, n)
    given = list(given)
    field = f"schedule.{region}.layers"
    if len(given) != n:
        raise SpecError(field, f"{given} has {len(given)} entries; give one per chunk: pipeline_stage x "
                               f"pp_interleave_num = {P} x {V} = {n}")
    if sum(given) != layers:
        raise SpecError(field, f"{given} sums to {sum(given)}; region {region!r} has {layers} layers")
    if any(not is_whole(x) or x < 1 for x in given):
        raise SpecError(field, f"{given}: every chunk needs a whole number >= 1 of layers")
    return given


def cut(profile: ModelProfile, schedule: Schedule, P: int, V: int) -> List[Chunk]:
    """The pipelined region gets P*V chunks (loop or V-shape placement of its order; sizes: the pipe's
    ``layers`` or the even split); other regions are one chunk."""
    chunks: List[Chunk] = []
    for i, (name, sk) in enumerate(schedule.parts):
        region = profile.region(name)
        if isinstance(sk, Pipe):
            sizes = pipe_layers(name, region.layers, sk.layers, P, V, f"mpipe.profile.regions[{i}].layers")
            start = 0
            for c, size in enumerate(sizes):
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
