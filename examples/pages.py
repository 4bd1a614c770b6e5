"""Document pages with known text, to check that OCR reads it back.

``make_page(seed)`` draws a few lines of words of different lengths and font sizes on a page of a random size
(Pillow's built-in scalable font, ``ImageFont.load_default(size=...)``, Pillow >= 10.1); the same seed always
gives the same page. ``read_back(page, lines)`` pairs each known line with what the OCR read there, and
``edit_distance`` scores it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

WORDS = ("invoice", "total", "amount", "due", "date", "order", "number", "customer", "address", "street", "city",
         "north", "station", "delivery", "payment", "received", "thank", "you", "for", "your", "business", "page",
         "report", "summary", "quarter", "revenue", "growth", "market", "energy", "water", "garden", "window",
         "Monday", "Friday", "March", "October", "Berlin", "Paris", "Tokyo", "Oslo", "Model", "Runner", "Tensor",
         "NPU", "OpenVINO", "ONNX", "2024", "2025", "17", "42", "365", "1080", "9.5", "12.75", "3x", "#128")


@dataclass(frozen=True)
class TextLine:
    text: str
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 of the drawn text, in page pixels
    size: int  # font size in pixels
    upside_down: bool = False  # drawn turned by 180 degrees


@dataclass(frozen=True)
class Page:
    image: np.ndarray  # [H, W, 3] uint8, BGR (OpenCV's order, as cv2.imread gives)
    lines: tuple[TextLine, ...]

    @property
    def text(self) -> str:
        return "\n".join(line.text for line in self.lines)


def make_page(seed: int, size: tuple[int, int] | None = None, upside_down: float = 0.0) -> Page:
    """A page of 3 to 7 lines of dark text on a light background.

    ``size`` (width, height) defaults to a random one between 480x360 and 1400x1100; each line has its own font
    size (16 to 40 px); a fraction ``upside_down`` of the lines is drawn turned by 180 degrees.
    """
    rng = np.random.default_rng(seed)
    width, height = size if size is not None else (int(rng.integers(480, 1400)), int(rng.integers(360, 1100)))
    paper = tuple(int(v) for v in rng.integers(225, 256, 3))
    page = Image.new("RGB", (width, height), paper)
    lines: list[TextLine] = []
    y = int(rng.integers(12, 40))
    for _ in range(int(rng.integers(3, 8))):
        font_size = int(rng.integers(16, 41))
        font = ImageFont.load_default(size=font_size)
        x = int(rng.integers(10, max(11, width // 6)))
        words: list[str] = []
        for _ in range(int(rng.integers(1, 8))):
            candidate = " ".join([*words, str(rng.choice(WORDS))])
            if x + font.getlength(candidate) > width - 10:
                break
            words = candidate.split(" ")
        if not words:
            continue
        text = " ".join(words)
        left, top, right, bottom = font.getbbox(text)
        if y + bottom + 4 > height:
            break
        ink = tuple(int(v) for v in rng.integers(0, 70, 3))
        turned = bool(rng.random() < upside_down)
        # Each line is drawn on its own strip so that it can be turned without moving.
        strip = Image.new("RGB", (right - left + 8, bottom - top + 8), paper)
        ImageDraw.Draw(strip).text((4 - left, 4 - top), text, font=font, fill=ink)
        if turned:
            strip = strip.rotate(180)
        page.paste(strip, (x + left - 4, y + top - 4))
        lines.append(TextLine(text, (x + left, y + top, x + right, y + bottom), font_size, turned))
        y += bottom + int(font_size * rng.uniform(0.6, 1.6))
    rgb = np.asarray(page)
    return Page(np.ascontiguousarray(rgb[:, :, ::-1]), tuple(lines))


def make_pages(count: int, seed: int = 0, upside_down: float = 0.0) -> list[Page]:
    return [make_page(seed * 1000 + k, upside_down=upside_down) for k in range(count)]


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: insertions, deletions and substitutions of characters."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def read_back(page: Page, boxes: Sequence[tuple[int, int, int, int]], texts: Sequence[str]) -> list[str]:
    """What was read on each known line: the texts whose box centre lies in the line's band of rows,
    joined left to right ("" where nothing was read)."""
    read: list[str] = []
    for line in page.lines:
        _, y0, _, y1 = line.box
        found = sorted((x0, text) for (x0, by0, _, by1), text in zip(boxes, texts) if y0 <= (by0 + by1) / 2 <= y1)
        read.append(" ".join(text for _, text in found))
    return read


def character_error_rate(page: Page, read: Sequence[str], ignore_spaces: bool = False) -> float:
    """Edit distance over all lines divided by the number of characters on the page.

    ``ignore_spaces``: compare with spaces taken out (the PP-OCRv4 recogniser, trained mostly on Chinese, often
    drops the spaces between English words while reading every letter right).
    """
    def norm(text: str) -> str:
        return text.replace(" ", "") if ignore_spaces else text

    errors = sum(edit_distance(norm(line.text), norm(got)) for line, got in zip(page.lines, read))
    return errors / max(1, sum(len(norm(line.text)) for line in page.lines))
