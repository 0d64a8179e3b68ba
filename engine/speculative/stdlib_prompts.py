"""Training prompts that need no download: the functions of Python's own standard library.

The source files of the standard library ship with every Python. Each public function with a
docstring becomes one of three instructions: complete the function from its signature and
docstring, write it from a description, or explain its source (all three where more prompts
are asked for than there are functions). The files are read and parsed
(``ast``), never imported, in a seeded order, so the same seed on the same Python gives the
same prompts. HumanEval is not used: it is the evaluation set.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path

SKIPPED_PARTS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3",
                 "turtledemo", "__pycache__", "ensurepip", "venv"}
MAX_DOC_CHARS = 600
MAX_SOURCE_LINES = 40


def stdlib_files(root: Path | None = None) -> list[Path]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py")
                  if not SKIPPED_PARTS & set(p.relative_to(root).parts))


def _functions(path: Path) -> list[tuple[str, str, str, str]]:
    """(name, signature, docstring, source) of the public documented functions of a file."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
        return []
    lines, out = text.splitlines(), []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 40:
            continue
        first = node.lineno - 1
        last = min(node.end_lineno or node.lineno, first + MAX_SOURCE_LINES)
        indent = len(lines[first]) - len(lines[first].lstrip())
        source = "\n".join(line[indent:] for line in lines[first:last])
        out.append((node.name, f"{node.name}({ast.unparse(node.args)})",
                    doc.strip()[:MAX_DOC_CHARS], source))
    return out


def _instruction(kind: int, name: str, signature: str, doc: str, source: str) -> str:
    if kind == 0:
        body = "\n".join("    " + line if line else "" for line in doc.splitlines())
        return (f"Complete this Python function:\n\n```python\ndef {signature}:\n"
                f'    """\n{body}\n    """\n```')
    if kind == 1:
        summary = " ".join(doc.split("\n\n")[0].split())
        return f"Write a Python function `{signature}`. {summary}"
    return f"Explain what this Python function does:\n\n```python\n{source}\n```"


def stdlib_prompts(count: int, *, seed: int = 0, root: Path | None = None) -> list[str]:
    """Up to ``count`` instructions from the standard library's documented functions: one
    instruction a function, the kinds in turn; past the number of functions, each function's
    other two kinds (so the first prompts do not depend on ``count``)."""
    files = stdlib_files(root)
    random.Random(seed).shuffle(files)
    functions: list[tuple[str, str, str, str]] = []
    for path in files:
        functions += _functions(path)
        if len(functions) >= count:
            break
    prompts = [_instruction(i % 3, *f) for i, f in enumerate(functions)]
    for shift in (1, 2):
        if len(prompts) >= count:
            break
        prompts += [_instruction((i + shift) % 3, *f) for i, f in enumerate(functions)]
    return prompts[:count]
