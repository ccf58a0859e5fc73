"""Write an episode's rgb_array frames to .mp4 or .gif, one frame at a time.

GIF goes through imageio (Pillow). MP4 goes through imageio when imageio-ffmpeg is installed
(H.264); without it, through OpenCV's writer, a pinned dependency (MPEG-4 Part 2, "mp4v": plays in
VLC, ffplay and most desktop players, not in every browser). H.264 frames are padded here to a
multiple of 16 pixels each way (the codec's macro block), repeating the edge pixels at the right and
the bottom, rather than left for imageio to stretch with a warning (CartPole's 600x400 becomes 608x400).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np

from nitro.errors import ConfigError

VIDEO_SUFFIXES = (".mp4", ".gif")
GIF_MAX_FPS = 50  # GIF delays count in 1/100 s, and viewers slow shorter delays down to 1/10 s
MACRO_BLOCK = 16  # H.264's block size: frames whose sides are multiples of it play everywhere


def check_video_path(path: str) -> Path:
    """The path of a video to write, or ConfigError naming what is allowed."""
    p = Path(path)
    if p.suffix.lower() not in VIDEO_SUFFIXES:
        raise ConfigError(f"video: {path}: the file name must end in {' or '.join(VIDEO_SUFFIXES)}")
    if p.is_dir():
        raise ConfigError(f"video: {path} is a directory; give a file name")
    return p


def gif_timing(fps: float) -> tuple[int, float]:
    """(keep every step-th frame, the GIF's frame rate). GIF delays are whole 1/100 s: take the
    smallest step whose delay keeps real time within 6%, else the nearest of three (Hopper's 125 fps:
    every 5th frame at 4/100 s)."""
    first = max(1, math.ceil(fps / GIF_MAX_FPS))

    def error(step: int) -> float:
        exact = 100.0 * step / fps
        return abs(round(exact) - exact) / exact

    steps = range(first, first + 3)
    step = next((s for s in steps if error(s) <= 0.06), min(steps, key=error))
    return step, 100.0 / max(2, round(100.0 * step / fps))


def pad_to_block(frame: np.ndarray, block: int = MACRO_BLOCK) -> np.ndarray:
    """The frame grown to a multiple of `block` in height and width by repeating its bottom row and right
    column (no new colour at the border, and the picture itself untouched at its top-left)."""
    height, width = frame.shape[:2]
    extra = (-height % block, -width % block)
    if not any(extra):
        return frame
    return np.pad(frame, ((0, extra[0]), (0, extra[1]), (0, 0)), mode="edge")


class VideoWriter:
    """`append(frame)` per (H, W, 3) uint8 frame, then `close()` (or use it as a context manager)."""

    def __init__(self, path: str, fps: float):
        self.path = check_video_path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.frames = 0  # frames appended (a GIF keeps every `step`-th)
        self.gif = self.path.suffix.lower() == ".gif"
        self.step, self.fps = gif_timing(fps) if self.gif else (1, fps)
        self._imageio = None
        self._opencv = None
        self._pad = False  # to MACRO_BLOCK (imageio's mp4)
        if self.gif:
            import imageio

            self._imageio = imageio.get_writer(self.path, mode="I", duration=1000.0 / self.fps, loop=0)
        elif importlib.util.find_spec("imageio_ffmpeg"):
            import imageio

            self._imageio = imageio.get_writer(self.path, fps=self.fps, macro_block_size=MACRO_BLOCK)
            self._pad = True

    def append(self, frame: np.ndarray) -> None:
        frame = np.asarray(frame)
        if frame.ndim != 3 or frame.shape[2] != 3:
            raise ConfigError(f"video: frames must be (height, width, 3) rgb arrays, got shape {frame.shape}")
        self.frames += 1
        if (self.frames - 1) % self.step:
            return
        if self._imageio is not None:
            self._imageio.append_data(pad_to_block(frame) if self._pad else frame)
            return
        import cv2

        if self._opencv is None:  # the frame size is known only now
            height, width = frame.shape[:2]
            self._opencv = cv2.VideoWriter(str(self.path), cv2.VideoWriter_fourcc(*"mp4v"), self.fps, (width, height))
            if not self._opencv.isOpened():
                raise ConfigError(f"video: OpenCV cannot write {self.path}; install imageio-ffmpeg for mp4, "
                                  f"or write a .gif")
        self._opencv.write(np.ascontiguousarray(frame[:, :, ::-1]))  # OpenCV takes BGR

    def close(self) -> None:
        if self._imageio is not None:
            self._imageio.close()
        if self._opencv is not None:
            self._opencv.release()

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
