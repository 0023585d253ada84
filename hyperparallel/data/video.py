"""Video files and frame lists: what a container says of its video stream, and frames decoded to RGB.

A video file is read with PyAV (FFmpeg's decoders, the ``av`` package): :func:`probe` reads the
container's header and the first video stream's frame count, rate and size (counting the stream's
packets when the header gives no count) without decoding pixels; :func:`read_frames` decodes the
stream in order and keeps the frames at the asked indices, as height x width x 3 uint8 RGB arrays.
A video given as a list of frame image files is read with Pillow (:func:`read_frame_images`).
Errors are :class:`VideoError` (a ValueError) with one line naming the file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Sequence

import numpy as np


class VideoError(ValueError):
    """A video that cannot be read; the message is one line naming the file."""


@dataclass(frozen=True)
class VideoInfo:
    total_frames: int   # frames of the first video stream
    fps: float          # its average frame rate
    width: int
    height: int


def _line(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


def probe(path: str) -> VideoInfo:
    """The first video stream's frame count, frame rate and size; VideoError if the file is missing,
    not a container PyAV opens, has no video stream, or gives no frame rate or no frames."""
    if not os.path.isfile(path):
        raise VideoError(f"video file not found: {path}")
    import av
    try:
        with av.open(path) as c:
            if not c.streams.video:
                raise VideoError(f"{path}: no video stream")
            s = c.streams.video[0]
            width, height = int(s.codec_context.width), int(s.codec_context.height)
            rate = s.average_rate or s.guessed_rate
            n = int(s.frames or 0)
            if n <= 0:   # the header gives no count: the stream's packets are its frames
                n = sum(1 for p in c.demux(s) if p.size)
    except VideoError:
        raise
    except Exception as e:   # av.error.* and what FFmpeg says of a broken file
        raise VideoError(f"{path}: not a readable video ({type(e).__name__}: {_line(e)})") from None
    if not rate or float(rate) <= 0:
        raise VideoError(f"{path}: the video stream gives no frame rate")
    if n <= 0 or width <= 0 or height <= 0:
        raise VideoError(f"{path}: the video stream has no frames")
    return VideoInfo(n, float(rate), width, height)


def read_frames(path: str, indices: Sequence[int]) -> List[np.ndarray]:
    """The frames at ``indices`` (0-based, in decoding order; repeats allowed) as (H, W, 3) uint8 RGB;
    VideoError if the file cannot be decoded or has fewer frames than the largest index."""
    want = sorted(set(int(i) for i in indices))
    got = {}
    import av
    try:
        with av.open(path) as c:
            s = c.streams.video[0]
            for k, frame in enumerate(c.decode(s)):
                if k in want:
                    got[k] = frame.to_ndarray(format="rgb24")
                if k >= want[-1]:
                    break
    except Exception as e:
        raise VideoError(f"{path}: cannot decode the video ({type(e).__name__}: {_line(e)})") from None
    missing = [i for i in want if i not in got]
    if missing:
        raise VideoError(f"{path}: decoded {len(got)} of the frames asked for; frame {missing[0]} is not there "
                         "(fewer frames than the header says)")
    return [got[int(i)] for i in indices]


def read_frame_images(paths: Sequence[str]) -> List[np.ndarray]:
    """Frame image files as (H, W, 3) uint8 RGB arrays; VideoError naming the file that fails."""
    from PIL import Image
    out = []
    for p in paths:
        try:
            with Image.open(p) as im:
                out.append(np.asarray(im.convert("RGB"), np.uint8))
        except Exception as e:
            raise VideoError(f"{p}: not a readable frame image ({type(e).__name__}: {_line(e)})") from None
    return out


def write_video(path: str, frames: Sequence[np.ndarray], fps: int = 4) -> None:
    """Write (H, W, 3) uint8 RGB frames as a lossless video (FFV1 in Matroska, or MPEG-4 for ``.mp4``)
    with PyAV: the demo set's and the tests' video files."""
    import av
    h, w = frames[0].shape[:2]
    with av.open(path, "w") as c:
        if path.endswith(".mp4"):
            s = c.add_stream("mpeg4", rate=fps)
            s.pix_fmt = "yuv420p"
        else:
            s = c.add_stream("ffv1", rate=fps)
            s.pix_fmt = "bgr0"
        s.width, s.height = w, h
        for f in frames:
            for pkt in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f, np.uint8), format="rgb24")):
                c.mux(pkt)
        for pkt in s.encode():
            c.mux(pkt)
