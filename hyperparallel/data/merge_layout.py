"""The ``merge_index`` layout's index side: LLaVA-style turns (:mod:`.text`), each image placeholder
expanded to the model's ``image_tokens`` rows, images resized to ``data.image_size``."""
from __future__ import annotations

from .index import Sample, image_path
from .text import SampleProblem, Tok, encode_conversation, image_files


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
            check_files(p)
        return Sample(where, str(rec.get("id", where)), files, enc)

    def decode_check(self, path: str) -> None:
        """Decode one image with the run's ops; SampleProblem('undecodable_image') if it fails."""
        from .pixels import decode_eager, transforms
        if self._ops is None:
            self._ops = transforms(self.cfg.image_size, self.cfg.mean, self.cfg.std)
        try:
            decode_eager(path, self._ops)
        except RuntimeError as e:
            raise SampleProblem("undecodable_image", str(e).replace("data: ", "", 1)) from None
