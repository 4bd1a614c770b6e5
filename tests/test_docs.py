"""The docs hold: every ```python block marked runnable in docs/*.md and README.md runs as a program, and the API
pages and docstrings cover every public name.

A block is marked runnable by an HTML comment on the line before its fence (invisible where the Markdown is
rendered):

    <!-- runnable -->
    ```python
    ...
    ```

Each such block is a complete program; it runs in a fresh Python process (two at a time), from an empty
directory, and must exit with status 0. Blocks hold their own asserts, so a block whose claims stop being true
fails here.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

import npurt
from npurt.streams import Stream

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
MARKER = "<!-- runnable -->"
BLOCK_TIMEOUT_S = 120


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def runnable_blocks(page: Path) -> list[Block]:
    """The ```python blocks of a page preceded by the runnable marker (ValueError for a marker without one)."""
    lines = page.read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```python":
            raise ValueError(f"{page.name}:{i + 1}: {MARKER} is not followed by a ```python fence")
        end = next((k for k in range(i + 2, len(lines)) if lines[k].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{page.name}:{i + 2}: the ```python block never closes")
        blocks.append(Block(page, i + 2, "\n".join(lines[i + 2:end]) + "\n"))
    return blocks


BLOCKS = [b for page in PAGES for b in runnable_blocks(page)]


def run_block(block: Block, workdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", block.code], cwd=workdir, capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT_S)


@cache
def _results(workdir: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every block's run, two processes at a time (the machine's other users keep the rest)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = pool.map(lambda b: run_block(b, workdir), BLOCKS)
        return {b.name: r for b, r in zip(BLOCKS, runs)}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    return _results(tmp_path_factory.mktemp("docs"))


def test_the_pages_have_runnable_blocks() -> None:
    pages = {b.page.name for b in BLOCKS}
    assert {"README.md", "porting.md", "streams.md", "throughput.md", "shapes-and-views.md", "api.md",
            "cache.md"} <= pages


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
def test_runnable_block(block: Block, results: dict[str, subprocess.CompletedProcess[str]]) -> None:
    run = results[block.name]
    assert run.returncode == 0, f"{block.name} exited with {run.returncode}:\n{run.stderr[-4000:]}"


# -- coverage of the public names ------------------------------------------------------------------------------
PUBLIC_CLASSES = [npurt.Runner, npurt.RunnerFactory, npurt.NpuTensor, npurt.NpuTensorInfo, npurt.InferQueue,
                  npurt.Tokenizer, npurt.ChatSession, npurt.QueueSlot, npurt.DeviceInfo, npurt.QuantParameters,
                  npurt.JobHandle, Stream]


def public_members(cls: type) -> list[str]:
    """Methods and properties defined by the class itself (not inherited from object, IntEnum or dataclass)."""
    names = []
    for name, value in vars(cls).items():
        if name.startswith("_") or name in ("__init__",):
            continue
        if inspect.isfunction(value) or isinstance(value, (property, staticmethod, classmethod)):
            names.append(name)
    return names


def test_api_page_names_every_public_name() -> None:
    page = (ROOT / "docs" / "api.md").read_text()
    missing = [n for n in npurt.__all__ if not re.search(rf"\b{re.escape(n)}\b", page)]
    for cls in PUBLIC_CLASSES:
        missing += [f"{cls.__name__}.{m}" for m in public_members(cls) if f"{m}" not in page]
    assert missing == []


def test_every_public_name_has_a_docstring() -> None:
    missing = []
    for name in npurt.__all__:
        obj = getattr(npurt, name)
        own = vars(obj).get("__doc__") if isinstance(obj, type) else obj.__doc__  # a class's own, not inherited
        if name != "__version__" and not (own or "").strip():
            missing.append(name)
    for cls in PUBLIC_CLASSES:
        for m in public_members(cls):
            value = vars(cls)[m]
            fn = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            if not (fn.__doc__ or "").strip():
                missing.append(f"{cls.__name__}.{m}")
    assert missing == []
