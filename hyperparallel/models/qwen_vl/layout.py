"""The ``qwen_vl`` layout's index side: each image's grid from its header size (no pixels decoded), each
video's sampled frames and grid from its container's header or its frames' headers (:mod:`.video`), the
chat layout (:mod:`.chat`) with that many image and video pads, and the full check of ``data check``.

A sample's ``video``: a video file name (decoded with PyAV) or a list of frame image file names (one
video); the conversation holds one ``<video>`` placeholder for it."""
from __future__ import annotations

from ...data.index import Sample, check_image, image_path
from .chat import QwenEncoded, QwenTokens, encode_chat
from .image import QwenPixels, image_grid, image_tokens
from .video import FramesError, QwenVideo, QwenVideoPixels, frame_indices, sampled_frames, video_grid, video_tokens
from ...data.text import SampleProblem, Tok, image_files


class QwenLayout:
    """``parse(where, record, check_files)`` -> :class:`~hyperparallel.data.index.Sample` (``enc``: a
    :class:`~.chat.QwenEncoded`); ``fmt``: a :class:`~.format.QwenVL`."""

    def __init__(self, cfg, fmt, tok: Tok):
        self.cfg, self.fmt, self.tok = cfg, fmt, tok
        self.special = QwenTokens.of(tok, fmt)
        self._pixels = self._video_pixels = None

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
        imgs, _ = image_files({k: v for k, v in rec.items() if k != "video"})
        files = tuple(image_path(cfg, f) for f in imgs)
        grids = tuple(self.grid(p, check_files(p)) for p in files)
        counts = [image_tokens(g, self.fmt.merge_size) for g in grids]
        videos = self.videos(rec.get("video"), check_files)
        ids, answer = encode_chat(rec.get("conversations"), self.tok, self.special, counts, cfg.system_prompt,
                                  [self.video_groups(v) for v in videos])
        if len(ids) > cfg.seq_len:
            vids = f", videos to {[video_tokens(v.grid, self.fmt.merge_size) for v in videos]}" if videos else ""
            raise SampleProblem("too_long", f"{len(ids)} tokens (images expanded to {counts} token(s){vids}) "
                                            f"> data.seq_len {cfg.seq_len}")
        return Sample(where, str(rec.get("id", where)), files, QwenEncoded(ids, answer, grids, tuple(videos)))

    # -- videos ---------------------------------------------------------------------------------
    def videos(self, field, check_files) -> list:
        """The sample's videos (:class:`~.video.QwenVideo`, none or one) from its ``video`` field."""
        if field is None or field == [] or field == "":
            return []
        if self.special.video_pad is None:
            raise SampleProblem("bad_video", f"field 'video': the tokenizer {self.tok.path} has no <|video_pad|> "
                                             "token (Qwen's layout of a video needs it)")
        cfg, fmt = self.cfg, self.fmt
        if isinstance(field, str):
            from ...data.video import VideoError, probe
            path = image_path(cfg, field)
            try:
                info = probe(path)
            except VideoError as e:
                kind = "missing_video" if "not found" in str(e) else "undecodable_video"
                raise SampleProblem(kind, f"field 'video': {e}") from None
            try:
                n = sampled_frames(info.total_frames, info.fps, cfg.fps, cfg.min_frames, cfg.max_frames)
            except FramesError as e:
                raise SampleProblem("bad_video", f"field 'video': {path}: {e}") from None
            idx = frame_indices(info.total_frames, n)
            grid = self._video_grid(path, n, info.width, info.height)
            rate = n / info.total_frames * info.fps
            return [QwenVideo(path, idx, grid, fmt.temporal_patch_size / rate, info.fps)]
        if not isinstance(field, list) or not all(isinstance(x, str) for x in field):
            raise SampleProblem("bad_record", "'video' must be a video file name or a list of frame image file names")
        if len(field) > cfg.max_frames:
            raise SampleProblem("too_many_frames", f"field 'video': {len(field)} frame images > data.max_frames "
                                                   f"{cfg.max_frames}")
        frames = tuple(image_path(cfg, f) for f in field)
        sizes = [check_files(p) for p in frames]
        other = next((k for k, wh in enumerate(sizes) if wh != sizes[0]), None)
        if other is not None:
            raise SampleProblem("bad_video", f"field 'video': frame {other} ({frames[other]}) is "
                                             f"{sizes[other][0]}x{sizes[other][1]} pixels but frame 0 is "
                                             f"{sizes[0][0]}x{sizes[0][1]}; a video's frames share one size")
        grid = self._video_grid(frames[0], len(frames), *sizes[0])
        return [QwenVideo(frames, None, grid, fmt.temporal_patch_size / cfg.fps, float(cfg.fps))]

    def _video_grid(self, path: str, frames: int, w: int, h: int) -> tuple:
        factor = self.fmt.factor
        if min(w, h) < factor:
            raise SampleProblem("video_too_small", f"{path} is {w}x{h} pixels; the qwen_vl layout needs each side "
                                                   f">= patch_size x merge_size = {factor} pixels")
        try:
            return video_grid(frames, h, w, self.fmt, self.cfg.min_pixels, self.cfg.max_pixels)
        except (ValueError, ZeroDivisionError) as e:
            raise SampleProblem("bad_video", f"{path} ({w}x{h} pixels): {e}") from None

    def video_groups(self, video: QwenVideo):
        """(pad count of each ``<|vision_start|>`` group, the text before it) of one video: one group
        (Qwen2.5-VL), or a group per temporal grid step after its timestamp (Qwen3-VL, ``per_frame``)."""
        t, h, w = video.grid
        per_step = h * w // (self.fmt.merge_size ** 2)
        if self.fmt.video_layout != "per_frame":
            return [t * per_step], [""]
        return [per_step] * t, [f"<{s:.1f} seconds>" for s in video.timestamps(self.fmt.temporal_patch_size)]

    def pixels(self) -> QwenPixels:
        """The processor callable of this layout (one per layout)."""
        if self._pixels is None:
            c = self.cfg
            self._pixels = QwenPixels(self.fmt, c.min_pixels, c.max_pixels, c.image_mean, c.image_std)
        return self._pixels

    def video_pixels(self) -> QwenVideoPixels:
        if self._video_pixels is None:
            c = self.cfg
            self._video_pixels = QwenVideoPixels(self.fmt, c.min_pixels, c.max_pixels, c.image_mean, c.image_std)
        return self._video_pixels

    def video_values(self, video: QwenVideo):
        """(``pixel_values_videos`` rows, grid) of one video, decoded now; RuntimeError naming it if it fails or
        its grid is not the index's."""
        from ...data.video import VideoError
        from .video import read_video
        try:
            pv, grid = self.video_pixels()(read_video(video))
        except (VideoError, OSError, ValueError, RuntimeError) as e:
            raise RuntimeError(f"data: cannot decode video {video.name}: {e}") from None
        got = tuple(int(x) for x in grid)
        if got != tuple(video.grid):
            raise RuntimeError(f"data: video {video.name}: grid_mismatch: the processor's grid {got} is not "
                               f"{tuple(video.grid)} from the index (changed since? hyperparallel data check RECIPE)")
        return pv, grid

    def decode_sample(self, sample) -> None:
        """``data check``: decode each video of ``sample`` given as a file (a frame list's frames are images,
        checked one by one); SampleProblem if it fails or its grid is not the index's."""
        for v in sample.enc.videos:
            if isinstance(v.source, str):
                try:
                    self.video_values(v)
                except RuntimeError as e:
                    raise SampleProblem("undecodable_video", str(e).replace("data: ", "", 1)) from None

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
