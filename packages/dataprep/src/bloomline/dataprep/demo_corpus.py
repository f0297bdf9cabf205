"""Offline demo corpus built from the docstrings and comments of the Python stdlib.

Every machine that can run this toolkit has a Python standard library, so its prose is a
source of real English text that needs no download. ``write_demo_corpus`` turns it into a
``.jsonl.zst`` file that the rest of the pipeline consumes like any other corpus.
"""

from __future__ import annotations

import ast
import inspect
import io
import itertools
import json
import math
import os
import re
import sysconfig
import tempfile
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import zstandard

DEFAULT_SIZE_MB: float = 3.0

_SKIP_DIRS = frozenset({"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"})
_MIN_CHARS = 40
# PEP 263 encoding declaration; only meaningful on the first two lines.
_CODING_RE = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+")


@dataclass(frozen=True)
class DemoCorpusSummary:
    """What ``write_demo_corpus`` produced.

    Attributes:
        path: The final ``.jsonl.zst`` file.
        num_documents: Number of JSON lines written.
        num_text_bytes: UTF-8 bytes of all ``"text"`` values (excluding JSON overhead).
    """

    path: Path
    num_documents: int
    num_text_bytes: int


def _stdlib_files(root: Path) -> list[tuple[str, Path]]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Pruning in place keeps os.walk from descending into the large test suites at all.
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        for fname in filenames:
            if fname.endswith(".py"):
                path = Path(dirpath, fname)
                found.append((path.relative_to(root).as_posix(), path))
    found.sort(key=lambda item: item[0])
    return found


def _module_name(rel: str) -> str:
    parts = rel[: -len(".py")].split("/")
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _comment_paragraphs(source: str) -> list[str]:
    paragraphs: list[list[str]] = []
    prev_line = -2
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        line = tok.start[0]
        if line == 1 and tok.string.startswith("#!"):
            continue
        if line <= 2 and _CODING_RE.match(tok.line):
            continue
        text = tok.string[1:]
        text = (text[1:] if text.startswith(" ") else text).rstrip()
        # Rulers like "#####" and bare "#" carry no prose; dropping them also makes a bare "#"
        # line act as a paragraph break, which is how the stdlib uses it.
        if not any(ch.isalnum() for ch in text):
            continue
        if line == prev_line + 1 and paragraphs:
            paragraphs[-1].append(text)
        else:
            paragraphs.append([text])
        prev_line = line
    return ["\n".join(p) for p in paragraphs]


def _clean(doc: str) -> str:
    # cleandoc leaves an indented closing line when the docstring has no other indented
    # line (e.g. a one-liner whose quotes close on the next line).
    return inspect.cleandoc(doc).rstrip()


def _definition_docs(tree: ast.Module, module: str) -> Iterator[tuple[str, str]]:
    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = f"{prefix}.{child.name}"
                doc = ast.get_docstring(child, clean=False)
                if doc:
                    if isinstance(child, ast.ClassDef):
                        header = f"class {qualname}"
                    else:
                        kw = "async def" if isinstance(child, ast.AsyncFunctionDef) else "def"
                        header = f"{kw} {qualname}({ast.unparse(child.args)})"
                    yield qualname, f"{header}\n\n{_clean(doc)}"
                yield from visit(child, qualname)
            else:
                # Definitions nested in if/try blocks still belong to the enclosing scope.
                yield from visit(child, prefix)

    yield from visit(tree, module)


def iter_stdlib_documents() -> Iterator[dict]:
    """Yield documents extracted from the installed standard library, in a fixed order.

    Each module yields one document of its docstring plus comments, then one document per
    documented class, function or method in source order. Files that are not valid UTF-8
    Python are skipped, as are texts shorter than 40 characters.

    Yields:
        Dicts ``{"id": int, "source": "module.qualname", "text": str}`` with ids from 0.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    next_id = 0
    for rel, path in _stdlib_files(root):
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        module = _module_name(rel)
        docstring = _clean(ast.get_docstring(tree, clean=False) or "")
        head = [docstring] if docstring else []
        candidates = [(module, "\n\n".join(head + _comment_paragraphs(source)))]
        candidates.extend(_definition_docs(tree, module))
        for name, text in candidates:
            if len(text) < _MIN_CHARS:
                continue
            try:
                # String-literal escapes can produce lone surrogates that UTF-8 cannot encode.
                text.encode("utf-8")
            except UnicodeEncodeError:
                continue
            yield {"id": next_id, "source": name, "text": text}
            next_id += 1


def _passes() -> Iterator[tuple[int, dict]]:
    # One pass costs seconds of parsing and tokenizing, so later passes replay a cached copy.
    cache = []
    for doc in iter_stdlib_documents():
        cache.append(doc)
        yield 1, doc
    if not any(doc["text"] for doc in cache):
        # Another pass would add nothing and loop forever.
        raise RuntimeError("no stdlib documents found; cannot build the demo corpus")
    for pass_no in itertools.count(2):
        for doc in cache:
            yield pass_no, doc


def write_demo_corpus(
    out_dir: str | Path,
    size_mb: float = DEFAULT_SIZE_MB,
    name: str = "stdlib_docs",
    overwrite: bool = False,
) -> DemoCorpusSummary:
    """Write ``OUT_DIR/NAME.jsonl.zst`` with about ``size_mb`` MB of stdlib text.

    Writing stops after the document that brings the text bytes to ``size_mb * 1e6``. If one
    pass over the stdlib is not enough, further passes follow with ids continuing and sources
    prefixed ``pass2:``, ``pass3:`` and so on. The output is byte-identical across runs on
    the same machine and appears atomically.

    Args:
        out_dir: Directory for the output; created if missing.
        size_mb: Target amount of UTF-8 text in megabytes (1e6 bytes); must be positive.
        name: File stem of the output.
        overwrite: Replace an existing output instead of refusing.

    Returns:
        A summary with the output path, document count and text byte count.

    Raises:
        ValueError: If ``size_mb`` is not positive and finite.
        FileExistsError: If the output exists and ``overwrite`` is False.
    """
    # Written so that NaN fails too; infinity would never finish.
    if not (size_mb > 0 and math.isfinite(size_mb)):
        raise ValueError(f"size_mb must be a positive finite number, got {size_mb!r}")
    out_dir = Path(out_dir)
    target = out_dir / f"{name}.jsonl.zst"
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} already exists; pass --overwrite to replace it")
    out_dir.mkdir(parents=True, exist_ok=True)

    target_bytes = size_mb * 1e6
    num_docs = 0
    text_bytes = 0
    tmp = tempfile.NamedTemporaryFile(dir=out_dir, delete=False, prefix=".", suffix=".partial")
    try:
        with tmp as fh, zstandard.ZstdCompressor(level=3).stream_writer(fh) as writer:
            for pass_no, doc in _passes():
                source = doc["source"] if pass_no == 1 else f"pass{pass_no}:{doc['source']}"
                out = {"id": num_docs, "source": source, "text": doc["text"]}
                writer.write((json.dumps(out, ensure_ascii=False) + "\n").encode("utf-8"))
                num_docs += 1
                text_bytes += len(doc["text"].encode("utf-8"))
                if text_bytes >= target_bytes:
                    break
        # NamedTemporaryFile creates 0600; a shared corpus should be readable like any file.
        os.chmod(tmp.name, 0o644)
        os.replace(tmp.name, target)
    except BaseException:
        tmp.close()
        Path(tmp.name).unlink(missing_ok=True)
        raise
    return DemoCorpusSummary(path=target, num_documents=num_docs, num_text_bytes=text_bytes)
