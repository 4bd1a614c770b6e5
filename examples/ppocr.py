"""The PP-OCR pipeline (PP-OCRv4 detector and recogniser, mobile direction classifier) as plain functions.

    image -> detection preprocessing -> detector -> DB post-processing (boxes)
          -> crops -> direction classifier (rotate 180 where it says so) -> recogniser -> CTC greedy decoding

It follows RapidOCR 1.4.4 (``rapidocr_onnxruntime``, the wheel the models come from, itself after PaddleOCR) with
its default settings, and reads what it reads: on 16 generated pages both gave the same texts and boxes (scores
within 2e-7). Left out: what RapidOCR does to images under 30 px or more than 8 times wider than high (it scales
them up or letterboxes them). Each model is reached through an "infer" callable (see ``infer.py``):
``npurt.Runner.run``, or ONNX Runtime / OpenVINO used directly (``ort_infer``, ``ov_infer``). Images are
``uint8`` arrays ``[H, W, 3]`` in OpenCV's BGR order (as ``cv2.imread`` gives).

Every stage asks for shapes of its own: the detector gets the page's size rounded to multiples of 32, the
classifier batches of ``[n, 3, 48, 192]``, the recogniser batches of ``[n, 3, 48, W]`` with W set by the widest
crop of the batch. An engine under this pipeline sees a new input shape on almost every call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import cv2
import numpy as np
import pyclipper

from infer import Infer, first_output, ort_infer, ov_infer

__all__ = ["DetConfig", "OcrLine", "PPOCR", "RecConfig", "classify_direction", "crop_text", "ctc_greedy_decode",
           "db_postprocess", "det_preprocess", "detect", "ort_infer", "ov_infer", "recognize", "sort_boxes"]

INPUT = "x"  # the input of all three PaddleOCR models


@dataclass(frozen=True)
class DetConfig:
    """RapidOCR's detector settings (its config.yaml)."""

    limit_side_len: int = 736
    limit_type: str = "min"  # "min": the short side scaled up to at least limit_side_len; "max": the long one down
    max_side_len: int = 2000  # pages larger than this are scaled down first
    thresh: float = 0.3  # probability above which a pixel is text
    box_thresh: float = 0.5  # mean probability inside a box to keep it
    unclip_ratio: float = 1.6  # how far the shrunk text kernel is grown back
    max_candidates: int = 1000
    use_dilation: bool = True
    min_size: int = 3


@dataclass(frozen=True)
class RecConfig:
    height: int = 48
    min_width: int = 320  # batches are at least this wide (PaddleOCR's rec_image_shape [3, 48, 320])
    width_multiple: int = 1  # round batch widths up to a multiple of this (1: PaddleOCR's own widths)
    batch_size: int = 6
    cls_batch_size: int = 6
    cls_thresh: float = 0.9  # classifier score above which a "180" crop is turned round
    text_score: float = 0.5  # lines recognised with a lower mean probability are dropped


DET_DEFAULTS = DetConfig()
REC_DEFAULTS = RecConfig()


@dataclass
class OcrLine:
    box: np.ndarray  # [4, 2] float32, clockwise from top-left, in the input image's pixels
    text: str
    score: float
    rotated: bool = False  # the classifier turned the crop round before recognition

    def bounds(self) -> tuple[int, int, int, int]:
        """x0, y0, x1, y1."""
        (x0, y0), (x1, y1) = self.box.min(axis=0), self.box.max(axis=0)
        return int(x0), int(y0), int(x1), int(y1)


# ------------------------------------------------------------------------------------------------ detection
def _resize_to_32(image: np.ndarray, ratio: float) -> np.ndarray:
    h, w = image.shape[:2]
    new_h = max(32, int(round(int(h * ratio) / 32) * 32))
    new_w = max(32, int(round(int(w * ratio) / 32) * 32))
    return cv2.resize(image, (new_w, new_h))


def det_preprocess(image: np.ndarray, config: DetConfig = DET_DEFAULTS) -> np.ndarray:
    """[H, W, 3] uint8 -> [1, 3, H', W'] float32, H' and W' multiples of 32, normalised to [-1, 1]."""
    h, w = image.shape[:2]
    if config.limit_type == "min":
        ratio = config.limit_side_len / min(h, w) if min(h, w) < config.limit_side_len else 1.0
    else:
        ratio = config.limit_side_len / max(h, w) if max(h, w) > config.limit_side_len else 1.0
    resized = _resize_to_32(image, ratio)
    normalized = (resized.astype(np.float32) * (1 / 255.0) - 0.5) / 0.5
    return np.ascontiguousarray(normalized.transpose(2, 0, 1)[np.newaxis])


def _mini_box(contour: np.ndarray) -> tuple[np.ndarray, float]:
    """The minimum-area rectangle around a contour, corners ordered top-left, top-right, bottom-right,
    bottom-left, and its short side."""
    rect = cv2.minAreaRect(contour)
    points = sorted(cv2.boxPoints(rect).tolist(), key=lambda p: p[0])
    left = sorted(points[:2], key=lambda p: p[1])
    right = sorted(points[2:], key=lambda p: p[1])
    return np.array([left[0], right[0], right[1], left[1]], np.float32), min(rect[1])


def _box_score(prob: np.ndarray, box: np.ndarray) -> float:
    """Mean probability inside the box (PaddleOCR's "fast" score)."""
    h, w = prob.shape
    x0 = int(np.clip(np.floor(box[:, 0].min()), 0, w - 1))
    x1 = int(np.clip(np.ceil(box[:, 0].max()), 0, w - 1))
    y0 = int(np.clip(np.floor(box[:, 1].min()), 0, h - 1))
    y1 = int(np.clip(np.ceil(box[:, 1].max()), 0, h - 1))
    mask = np.zeros((y1 - y0 + 1, x1 - x0 + 1), np.uint8)
    cv2.fillPoly(mask, [(box - [x0, y0]).astype(np.int32)], 1)
    return float(cv2.mean(prob[y0:y1 + 1, x0:x1 + 1], mask)[0])


def _unclip(box: np.ndarray, ratio: float) -> np.ndarray:
    """Grow the box by ``area * ratio / perimeter``, as PaddleOCR does: pyclipper's offset with round joins."""
    x, y = box[:, 0].astype(np.float64), box[:, 1].astype(np.float64)
    area = 0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))
    perimeter = float(np.linalg.norm(box - np.roll(box, 1, axis=0), axis=1).sum())
    offset = pyclipper.PyclipperOffset()
    offset.AddPath(box, pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    return np.array(offset.Execute(area * ratio / perimeter)).reshape(-1, 1, 2)


def db_postprocess(prob: np.ndarray, dest_h: int, dest_w: int,
                   config: DetConfig = DET_DEFAULTS) -> tuple[list[np.ndarray], list[float]]:
    """Differentiable Binarization post-processing: probability map [H, W] -> text boxes (each [4, 2] float32,
    in a ``dest_w`` x ``dest_h`` image) and their scores."""
    bitmap = (prob > config.thresh).astype(np.uint8)
    if config.use_dilation:
        bitmap = cv2.dilate(bitmap, np.ones((2, 2), np.uint8))
    height, width = bitmap.shape
    contours, _ = cv2.findContours(bitmap * 255, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    boxes, scores = [], []
    for contour in contours[:config.max_candidates]:
        points, short_side = _mini_box(contour)
        if short_side < config.min_size:
            continue
        score = _box_score(prob, points)
        if score < config.box_thresh:
            continue
        grown = _unclip(points, config.unclip_ratio)
        if len(grown) < 3:  # a degenerate box pyclipper could not offset
            continue
        box, short_side = _mini_box(grown)
        if short_side < config.min_size + 2:
            continue
        box[:, 0] = np.clip(np.round(box[:, 0] / width * dest_w), 0, dest_w)
        box[:, 1] = np.clip(np.round(box[:, 1] / height * dest_h), 0, dest_h)
        boxes.append(box)
        scores.append(score)
    return boxes, scores


def _order_clockwise(box: np.ndarray) -> np.ndarray:
    by_x = box[np.argsort(box[:, 0])]
    (tl, bl), (tr, br) = by_x[:2][np.argsort(by_x[:2, 1])], by_x[2:][np.argsort(by_x[2:, 1])]
    return np.array([tl, tr, br, bl], np.float32)


def sort_boxes(boxes: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Reading order: top to bottom, then left to right within a line (tops within 10 px)."""
    ordered = sorted(boxes, key=lambda b: (b[0][1], b[0][0]))
    for i in range(len(ordered) - 1):
        for j in range(i, -1, -1):
            if abs(ordered[j + 1][0][1] - ordered[j][0][1]) < 10 and ordered[j + 1][0][0] < ordered[j][0][0]:
                ordered[j], ordered[j + 1] = ordered[j + 1], ordered[j]
            else:
                break
    return ordered


def detect(infer: Infer, image: np.ndarray, config: DetConfig = DET_DEFAULTS) -> list[np.ndarray]:
    """Text boxes in ``image`` (each [4, 2] float32, clockwise from top-left), in reading order."""
    h, w = image.shape[:2]
    prob = first_output(infer({INPUT: det_preprocess(image, config)}))[0, 0]
    boxes, _ = db_postprocess(prob, h, w, config)
    kept = []
    for box in boxes:
        box = _order_clockwise(box)
        box[:, 0] = np.clip(box[:, 0], 0, w - 1).astype(np.int32)
        box[:, 1] = np.clip(box[:, 1], 0, h - 1).astype(np.int32)
        if int(np.linalg.norm(box[0] - box[1])) > 3 and int(np.linalg.norm(box[0] - box[3])) > 3:
            kept.append(box)
    return sort_boxes(kept)


def crop_text(image: np.ndarray, box: np.ndarray) -> np.ndarray:
    """The box cut out and straightened; a crop at least 1.5 times taller than wide is turned upright."""
    width = int(max(np.linalg.norm(box[0] - box[1]), np.linalg.norm(box[2] - box[3])))
    height = int(max(np.linalg.norm(box[0] - box[3]), np.linalg.norm(box[1] - box[2])))
    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], np.float32)
    transform = cv2.getPerspectiveTransform(box.astype(np.float32), target)
    crop = cv2.warpPerspective(image, transform, (width, height), borderMode=cv2.BORDER_REPLICATE,
                               flags=cv2.INTER_CUBIC)
    if crop.shape[0] >= 1.5 * crop.shape[1]:
        crop = np.ascontiguousarray(np.rot90(crop))
    return crop


# ------------------------------------------------------------------------------------------ classification
def _resize_pad(crop: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize to ``height`` keeping the aspect ratio (at most ``width`` wide), normalise to [-1, 1], pad right."""
    h, w = crop.shape[:2]
    resized_w = min(width, int(math.ceil(height * w / h)))
    resized = cv2.resize(crop, (resized_w, height)).astype(np.float32)
    padded = np.zeros((3, height, width), np.float32)
    padded[:, :, :resized_w] = (resized.transpose(2, 0, 1) / 255 - 0.5) / 0.5
    return padded


def classify_direction(infer: Infer, crops: list[np.ndarray], config: RecConfig = REC_DEFAULTS
                       ) -> tuple[list[np.ndarray], list[bool]]:
    """Turn round the crops the direction classifier finds upside down; batches of [n, 3, 48, 192] in order of
    aspect ratio. Returns the crops and which were turned."""
    crops = list(crops)
    rotated = [False] * len(crops)
    order = np.argsort([c.shape[1] / c.shape[0] for c in crops], kind="stable")
    for start in range(0, len(crops), config.cls_batch_size):
        batch = order[start:start + config.cls_batch_size]
        x = np.stack([_resize_pad(crops[i], 48, 192) for i in batch])
        probs = first_output(infer({INPUT: x}))
        for i, p in zip(batch, probs):
            label = int(p.argmax())
            if label == 1 and p[label] > config.cls_thresh:  # labels "0", "180"
                crops[i] = cv2.rotate(crops[i], cv2.ROTATE_180)
                rotated[i] = True
    return crops, rotated


# ------------------------------------------------------------------------------------------------ recognition
def ctc_greedy_decode(probs: np.ndarray, characters: Sequence[str]) -> list[tuple[str, float]]:
    """[N, T, C] class probabilities -> (text, mean probability of the kept steps) per row.

    Class 0 is the CTC blank, class k the dictionary's line k-1, the last class a space; repeats collapse.
    """
    classes = ["", *characters, " "]
    if probs.shape[-1] != len(classes):
        raise ValueError(f"the recogniser has {probs.shape[-1]} classes, the dictionary {len(classes)}")
    best, best_prob = probs.argmax(axis=2), probs.max(axis=2)
    results = []
    for idx, prob in zip(best, best_prob):
        keep = np.ones(len(idx), bool)
        keep[1:] = idx[1:] != idx[:-1]
        keep &= idx != 0
        text = "".join(classes[k] for k in idx[keep])
        results.append((text, float(prob[keep].mean()) if keep.any() else 0.0))
    return results


def rec_width(crops: Sequence[np.ndarray], config: RecConfig = REC_DEFAULTS) -> int:
    """The input width of a batch: its widest crop at height 48, at least ``min_width``."""
    ratio = max([config.min_width / config.height] + [c.shape[1] / c.shape[0] for c in crops])
    width = int(config.height * ratio)
    return -(-width // config.width_multiple) * config.width_multiple


def recognize(infer: Infer, crops: Sequence[np.ndarray], characters: Sequence[str],
              config: RecConfig = REC_DEFAULTS) -> list[tuple[str, float]]:
    """Text and score per crop; crops are batched in order of aspect ratio, so each batch is of similar width."""
    results: list[tuple[str, float]] = [("", 0.0)] * len(crops)
    order = np.argsort([c.shape[1] / c.shape[0] for c in crops], kind="stable")
    for start in range(0, len(crops), config.batch_size):
        batch = order[start:start + config.batch_size]
        width = rec_width([crops[i] for i in batch], config)
        x = np.stack([_resize_pad(crops[i], config.height, width) for i in batch])
        for i, result in zip(batch, ctc_greedy_decode(first_output(infer({INPUT: x})), characters)):
            results[i] = result
    return results


# ------------------------------------------------------------------------------------------------ the pipeline
@dataclass
class PPOCR:
    """Detector, optional direction classifier and recogniser, each an infer callable.

    >>> ocr = PPOCR(det=ort_infer(zoo.path("ocr_det")), cls=ort_infer(zoo.path("ocr_cls")),
    ...             rec=ort_infer(zoo.path("ocr_rec")), characters=zoo.ocr_characters())
    >>> for line in ocr(cv2.imread("page.png")): print(line.text, line.box.tolist())
    """

    det: Infer
    rec: Infer
    characters: Sequence[str]
    cls: Infer | None = None
    det_config: DetConfig = field(default_factory=DetConfig)
    rec_config: RecConfig = field(default_factory=RecConfig)

    def __call__(self, image: np.ndarray) -> list[OcrLine]:
        if image.ndim == 2:
            image = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
        # Pages beyond max_side_len are scaled down first; boxes are scaled back at the end.
        h, w = image.shape[:2]
        scaled = image
        if max(h, w) > self.det_config.max_side_len:
            scaled = _resize_to_32(image, self.det_config.max_side_len / max(h, w))
        boxes = detect(self.det, scaled, self.det_config)
        if not boxes:
            return []
        crops = [crop_text(scaled, box) for box in boxes]
        rotated = [False] * len(crops)
        if self.cls is not None:
            crops, rotated = classify_direction(self.cls, crops, self.rec_config)
        texts = recognize(self.rec, crops, self.characters, self.rec_config)
        scale = np.array([w / scaled.shape[1], h / scaled.shape[0]], np.float32)
        return [OcrLine(box * scale, text, score, turned)
                for box, (text, score), turned in zip(boxes, texts, rotated)
                if score >= self.rec_config.text_score]
