"""The ``merge_index`` layout's index side: LLaVA-style turns (:mod:`.text`), each image placeholder
expanded to the model's ``image_tokens`` rows, images resized to ``data.image_size``.

``mindspore.dataset.vision.Decode`` reads JPEG, PNG, BMP, TIFF and PPM files; a GIF or WebP file makes
it fail *and* write the file into the working directory (``./unsupported_image.gif``), other formats
just fail. Files of another format are therefore ``unsupported_image`` problems of the index, found
from the header before any decode (:func:`check_decodable`).
"""
from __future__ import annotations

import os

from .index import Sample, image_path
from .text import SampleProblem, Tok, encode_conversation, image_files


# PIL's names of the formats vision.Decode reads (MPO: a camera JPEG with a second picture)
DECODE_FORMATS = ("JPEG", "MPO", "PNG", "BMP", "TIFF", "PPM")


def check_decodable(path: str) -> None:
    """SampleProblem('unsupported_image') if PIL identifies ``path`` as a format vision.Decode does not
    read; a missing or unidentifiable file is left to the header check (``check_files``)."""
    if not os.path.isfile(path):
        return
    from PIL import Image
    try:
        with Image.open(path) as im:
            fmt = im.format
    except Exception:   # reported by the header check as unreadable_image
        return
    if fmt not in DECODE_FORMATS:
        raise SampleProblem("unsupported_image", f"{path} is a {fmt} image; mindspore.dataset.vision.Decode of "
                                                 f"this layout reads {', '.join(DECODE_FORMATS)} (convert it)")


class MergeLayout:
    """``parse(where, record, check_files)`` -> :class:`~.index.Sample` (``enc``: :class:`~.text.Encoded`)."""

    def __init__(self, cfg, tokens_per_image: int, tok: Tok):
        self.cfg, self.k, self.tok = cfg, int(tokens_per_image), tok
        self._ops = None

    def parse(self, where: str, rec, check_files) -> Sample:
        cfg, k = self.cfg, self.k
        if not isinstance(rec, dict):
            raise SampleProblem("bad_record", "a sample must be a JSON object")
        imgs, frames = image_files(rec)
        enc = encode_conversation(rec.get("conversations"), self.tok, len(imgs), len(frames), k)
        if enc.length > cfg.seq_len:
            raise SampleProblem("too_long", f"{enc.length} tokens (images expanded to {k} token(s) "
                                            f"each) > data.seq_len {cfg.seq_len}")
        files = tuple(image_path(cfg, f) for f in imgs + frames)
        for p in files:
            check_decodable(p)   # before check_files: data check's check_files decodes
            check_files(p)
        return Sample(where, str(rec.get("id", where)), files, enc)

    def decode_check(self, path: str) -> None:
        """Decode one image with the run's ops; SampleProblem('undecodable_image') if it fails."""
        from .pixels import decode_eager, transforms
        check_decodable(path)
        if self._ops is None:
            self._ops = transforms(self.cfg.image_size, self.cfg.mean, self.cfg.std)
        try:
            decode_eager(path, self._ops)
        except RuntimeError as e:
            raise SampleProblem("undecodable_image", str(e).replace("data: ", "", 1)) from None
