"""mkdocs hook: links from docs/ to the repository's own files (``../examples/infer.py``, ``../README.md``).

Such links work where the Markdown is read in the repository (GitHub, an editor), but the built site holds only
docs/, and mkdocs reports them as unresolved. This hook checks that each one names a file or directory that exists
in the repository (a broken one is a warning, so ``mkdocs build --strict`` fails on it) and, in the built site,
replaces it with its text and the repository path in code type.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.npurt_links")

# [text](target) outside code; a target with a scheme (https:) or an anchor only is left alone
_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")


def _outside_docs(target: str, page_dir: Path, docs_dir: Path, repo: Path) -> Path | None:
    """The repository path a relative link points to, where it leaves docs/ (else None)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    path = (page_dir / target.split("#", 1)[0]).resolve()
    if path == docs_dir or docs_dir in path.parents:
        return None
    if repo not in path.parents and path != repo:
        return None
    return path


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    repo = Path(config["config_file_path"]).resolve().parent
    page_dir = (docs_dir / page.file.src_path).parent
    out, in_fence = [], False
    for line in markdown.splitlines(keepends=True):
        if _FENCE.match(line.lstrip()):
            in_fence = not in_fence
        if in_fence:
            out.append(line)
            continue

        def replace(m: re.Match[str]) -> str:
            path = _outside_docs(m["target"], page_dir, docs_dir, repo)
            if path is None:
                return m[0]
            if not path.exists():
                log.warning("%s: the link %r names %s, which is not in the repository", page.file.src_path,
                            m["target"], path.relative_to(repo) if repo in path.parents else path)
                return m[0]
            shown = path.relative_to(repo).as_posix() + ("/" if path.is_dir() else "")
            text = m["text"]
            return text if text.strip("`") == shown.rstrip("/") or text.strip("`") == shown else \
                f"{text} (`{shown}`)"

        out.append(_LINK.sub(replace, line))
    return "".join(out)
