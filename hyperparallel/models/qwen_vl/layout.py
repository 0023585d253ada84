"""The ``qwen_vl`` layout's index side: each image's grid from its header size (no pixels decoded),
the chat layout (:mod:`.chat`) with that many image pads, and the full check of ``data check``."""
from __future__ import annotations

from ...data.index import Sample, check_image, image_path
from .chat import QwenEncoded, QwenTokens, encode_chat
from .image import QwenPixels, image_grid, image_tokens
from ...data.text import SampleProblem, Tok, image_files


class QwenLayout:
    """``parse(where, record, check_files)`` -> :class:`~hyperparallel.data.index.Sample` (``enc``: a
    :class:`~.chat.QwenEncoded`); ``fmt``: a :class:`~.format.QwenVL`."""

    def __init__(self, cfg, fmt, tok: Tok):
        self.cfg, self.fmt, self.tok = cfg, fmt, tok
        self.special = QwenTokens.of(tok, fmt)
        self._pixels = None

    def grid(self, path: str, size) -> tuple:
        """(t, h, w) of an image of header ``size`` (width, height); SampleProblem if Qwen's rule refuses it
        or a side is below one merged patch (``image_too_small``: the image is less than one LLM token's
        pixels wide or high; earlier transformers releases' ``smart_resize`` refused it the same way)."""
        w, h = size
        factor = self.fmt.factor
        if min(w, h) < factor:
            raise SampleProblem("image_too_small", f"{path} is {w}x{h} pixels; the qwen_vl layout needs each side "
                                                   f">= patch_size x merge_size = {self.fmt.patch_size} x "
                                                   f"{self.fmt.merge_size} = {factor} pixels")
        try:
            return image_grid(h, w, self.fmt, self.cfg.min_pixels, self.cfg.max_pixels)
        except (ValueError, ZeroDivisionError) as e:
            raise SampleProblem("bad_image_size", f"{path} ({w}x{h} pixels): {e}") from None

    def parse(self, where: str, rec, check_files=check_image) -> Sample:
        cfg = self.cfg
        if not isinstance(rec, dict):
            raise SampleProblem("bad_record", "a sample must be a JSON object")
        if rec.get("video"):
            raise SampleProblem("unsupported_video", "field 'video': video samples are not supported by the "
                                                     "qwen_vl layout yet (images only)")
        imgs, _ = image_files(rec)
        files = tuple(image_path(cfg, f) for f in imgs)
        grids = tuple(self.grid(p, check_files(p)) for p in files)
        counts = [image_tokens(g, self.fmt.merge_size) for g in grids]
        ids, answer = encode_chat(rec.get("conversations"), self.tok, self.special, counts, cfg.system_prompt)
        if len(ids) > cfg.seq_len:
            raise SampleProblem("too_long", f"{len(ids)} tokens (images expanded to {counts} token(s)) "
                                            f"> data.seq_len {cfg.seq_len}")
        return Sample(where, str(rec.get("id", where)), files, QwenEncoded(ids, answer, grids))

    def pixels(self) -> QwenPixels:
        """The processor callable of this layout (one per layout)."""
        if self._pixels is None:
            c = self.cfg
            self._pixels = QwenPixels(self.fmt, c.min_pixels, c.max_pixels, c.image_mean, c.image_std)
        return self._pixels

    def decode_check(self, path: str) -> None:
        """Run the processor on one image; SampleProblem if it fails or its grid is not the header's."""
        from ...data.pixels import decode_eager
        try:
            _, grid = decode_eager(path, [self.pixels()])
        except RuntimeError as e:
            raise SampleProblem("undecodable_image", str(e).replace("data: ", "", 1)) from None
        want = self.grid(path, check_image(path))
        if tuple(int(x) for x in grid) != want:
            raise SampleProblem("grid_mismatch", f"{path}: the processor's grid {tuple(int(x) for x in grid)} "
                                                 f"is not {want} from the image header")
