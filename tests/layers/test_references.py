"""No comment, docstring or page cites a file or a module the repository does not have.

Scans the product packages (their comments and docstrings), docs/, README.md and pyproject.toml:
- a path (`stopdesk/services/stop.py`, `stopdrill/sandbox/`, or a tail such as
  `services/batch.py`, `items/fields.html`, `launcher.py`) must name a file or folder of the
  repository, from its top or as the end of one;
- an import shown (`from stopdesk.client import Client`) or a dotted name in backticks that starts
  with one of our packages (`stopdesk.services.stop.task_request_stop`) must name a module that
  exists and names defined in it (read from its source, nothing imported); a name the code gives
  as a string (a Celery task `reconcile.cancel_items`, a span `stopdesk.stop`) counts too.

After files move, rerun `pytest tests/layers/test_references.py` (or `python -m
tests.layers.test_references`, which lists every miss as file:line).
"""

from __future__ import annotations

import ast
import functools
import io
import os
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("stopdesk", "reconcile", "stopdrill")
SCANNED = [*PACKAGES, "docs", "README.md", "pyproject.toml"]
TEXT = {".py", ".md", ".toml", ".html", ".txt", ".css", ".js"}
SKIP_DIRS = {"__pycache__", "node_modules", "git-venv"}
RUNTIME = {"var"}  # folders the running service makes (data, broker): named, never committed
NOT_FILES = {"Node.js"}  # words that look like a file name
# The MCP clients' own config files, named where the README shows each client's config.
NOT_FILES |= {"claude_desktop_config.json", ".cursor/mcp.json", ".codex/config.toml", ".vscode/mcp.json"}
# The file an operator writes with audit_export, named where AUDIT.md shows a run of it.
NOT_FILES |= {"audit.jsonl", "./audit.jsonl"}
# Django's own admin templates, which the admin's pages extend.
NOT_FILES |= {"admin/change_list.html", "admin/base_site.html"}

EXTENSIONS = "py|md|toml|html|css|js|json|yml|yaml|in|txt|cfg|ini|sh|sql|csv|jsonl"
URL = re.compile(r"[a-z][a-z+.-]*://\S+")
# a path: names separated by slashes ending in a known extension, or one name with one dot and a
# known extension (`launcher.py`; `a.b.py` reads as a dotted name); or a folder path (ends with a
# slash) that starts at a top-level folder
FILE = re.compile(
    rf"(?<![\w./<>-])((?:[\w.-]+/)+[\w-][\w.-]*\.(?:{EXTENSIONS})|[\w-]+\.(?:{EXTENSIONS}))(?![\w/(-]|\.\w)"
)
FOLDER = re.compile(r"(?<![\w./<>-])((?:[\w-]+/)+)(?![\w.-])")
DOTTED = re.compile(rf"`((?:{'|'.join(PACKAGES)})(?:\.\w+)+)(?:\(\))?`")
# an import shown in a page or a docstring: `from stopdesk.client import Client, AsyncClient`
FROM_IMPORT = re.compile(rf"from ((?:{'|'.join(PACKAGES)})(?:\.\w+)*) import ([\w ,()]+)")
# a name given as a string (a Celery task, a beat job, a span, a span attribute, a bench figure)
NAME_LITERAL = re.compile(rf"""["']((?:{"|".join(PACKAGES)})(?:\.\w+)+)["']""")


def scanned_files() -> list[Path]:
    found = []
    for entry in SCANNED:
        path = ROOT / entry
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for candidate in candidates:
            if candidate.is_file() and candidate.suffix in TEXT and not SKIP_DIRS & set(candidate.parts):
                found.append(candidate)
    return found


@functools.cache
def repository_files() -> tuple[set[str], set[str]]:
    """Every file and folder of the repository (relative, with forward slashes)."""
    files, folders = set(), set()
    for top, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS]
        rel = Path(top).relative_to(ROOT).as_posix()
        prefix = "" if rel == "." else rel + "/"
        folders.update(prefix + d for d in dirs)
        files.update(prefix + n for n in names)
    return files, folders


def path_exists(ref: str) -> bool:
    """A file or folder of the repository, from its top (`stopdesk/services/stop.py`) or its tail
    (`services/stop.py`, `stopdesk/admin.css` for static/stopdesk/admin.css)."""
    files, folders = repository_files()
    pool = folders if ref.endswith("/") else files
    ref = ref.removeprefix("./").rstrip("/")
    if ref.split("/")[0] in RUNTIME:
        return True
    return any(f == ref or f.endswith("/" + ref) for f in pool)


@functools.cache
def top_level() -> set[str]:
    return {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}


@functools.cache
def registered_names() -> set[str]:
    names = set()
    for folder in (*PACKAGES, "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            names.update(NAME_LITERAL.findall(path.read_text()))
    return names


def module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def defined_names(path: Path) -> dict[str, ast.AST]:
    """Names a module's source binds at its top level (defs, classes, assignments, imports)."""
    return body_names(ast.parse(path.read_text()).body)


def body_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names[name.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, ast.If | ast.Try | ast.With):
            for inner in ast.iter_child_nodes(node):
                if isinstance(inner, ast.stmt):
                    names.update(body_names([inner]))
    return names


def dotted_exists(ref: str) -> bool:
    if ref in registered_names():
        return True
    parts = ref.split(".")
    # the longest prefix that is a module of ours, then names defined along the rest
    for cut in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:cut]))
        if path is None:
            continue
        names, rest = defined_names(path), parts[cut:]
        for i, name in enumerate(rest):
            node = names.get(name)
            if node is None:
                return False
            if not isinstance(node, ast.ClassDef):
                return True  # a function's or a value's attributes are not read from source
            names = body_names(node.body)
            if i == len(rest) - 1:
                return True
        return True
    return False


def prose(path: Path) -> list[tuple[int, str]]:
    """The lines a reader reads: a page whole, a Python module's comments and docstrings (its
    triple-quoted strings; a string in code is a value, not a citation)."""
    text = path.read_text()
    if path.suffix != ".py":
        return list(enumerate(text.splitlines(), start=1))
    lines = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT or (token.type == tokenize.STRING and token.string.endswith('"""')):
            for offset, line in enumerate(token.string.splitlines()):
                lines.append((token.start[0] + offset, line))
    return lines


def misses() -> list[str]:
    found = []
    for path in scanned_files():
        rel = path.relative_to(ROOT).as_posix()
        for number, line in prose(path):
            text = URL.sub("", line)
            refs = [("path", m) for m in FILE.findall(text)]
            refs += [("path", m) for m in FOLDER.findall(text) if m.split("/")[0] in top_level()]
            refs += [("module", m) for m in DOTTED.findall(text)]
            for module, names in FROM_IMPORT.findall(text):
                refs += [("module", f"{module}.{name}") for name in re.findall(r"\w+", names)]
            for kind, ref in refs:
                if ref in NOT_FILES:
                    continue
                exists = path_exists(ref) if kind == "path" else dotted_exists(ref)
                if not exists:
                    found.append(f"{rel}:{number}: {kind} `{ref}` not found")
    return found


def test_no_file_or_module_cited_is_missing() -> None:
    assert len(scanned_files()) > 100
    missing = misses()
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


def test_the_scanner_sees_a_stale_reference() -> None:
    assert path_exists("stopdesk/services/stop.py")
    assert path_exists("services/stop.py")
    assert not path_exists("stopdesk/services/nowhere.py")
    assert not path_exists("stopdesk/nowhere/")
    assert dotted_exists("stopdesk.services.stop.task_request_stop")
    assert not dotted_exists("stopdesk.services.stop.nothing_by_that_name")
    assert not dotted_exists("stopdesk.nowhere")


if __name__ == "__main__":
    print("\n".join(misses()) or "no missing references")
