"""evalplus's sanitiser, ported to Python's own parser: the code of a chat answer, whatever surrounds it.

evalplus (``evalplus/sanitize.py``, tree-sitter) grades a chat answer in two steps, and so does :func:`sanitize`:

1. Extraction (:func:`longest_code_span`): of every run of two or more consecutive lines that parses as Python,
   the one with the most non-blank lines (the first such run when several tie). Prose, fence markers and example
   output fall outside it, fenced or not.
2. Pruning: of that run's top-level statements, every import; each class; each function that returns something
   somewhere in its body (decorated ones are not plain definitions to it and go); each assignment to a name; the
   first definition of a name wins. With an entry point, a definition is kept only when the entry point reaches it
   through the identifiers each definition mentions (``E = lambda *a: _impl(*a)`` keeps ``_impl``); test code,
   prints and ``if __name__`` blocks go.

Where a reference implementation exists its code is the specification: the differences are where tree-sitter and
:mod:`ast` see a text differently (tree-sitter recovers from a syntax error, so evalplus keeps the parts of a text
no run of which parses; here nothing is kept then). Bounded: the extraction reads at most :data:`MAX_PARSED`
lines read by its parses, all together (a run can only win with more non-blank lines than the best so far, so
most runs are never parsed), over the first :data:`MAX_LINES` lines.

Shape legend: none (strings in, strings out).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

MAX_LINES = 400  # lines of a response the extraction reads (a 512-token answer has far fewer)
MAX_PARSED = 300_000  # lines the extraction's parses read at most, all together (about 1 s on a 2-core CPU)


def parses(code: str) -> bool:
    """Whether ``code`` parses as Python (evalplus's ``syntax_check``)."""
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def longest_code_span(text: str) -> str:
    """Step 1 (see the module docstring): the run of at least two lines that parses with the most non-blank lines,
    the first in reading order among equals (the shortest of the runs from its first line that have as many); the
    first line when none parses. Trailing blank lines never change whether a run parses, so one run per count of
    non-blank lines is tried, the largest counts first."""
    lines = text.split("\n")[:MAX_LINES]
    counts = [0]
    for line in lines:
        counts.append(counts[-1] + bool(line.strip()))
    best, span, read = 0, (0, 0), 0
    for first in range(len(lines) - 1):
        if counts[len(lines)] - counts[first] <= best:
            break  # no run from here on has more non-blank lines
        ends = {}  # non-blank lines of a run from `first` -> the shortest such run's last line (two lines at least)
        for last in range(first + 1, len(lines)):
            ends.setdefault(counts[last + 1] - counts[first], last)
        for size in sorted(ends, reverse=True):
            if size <= best:
                break
            read += ends[size] + 1 - first
            if read > MAX_PARSED:
                return "\n".join(lines[span[0]:span[1] + 1])
            if parses("\n".join(lines[first:ends[size] + 1])):
                best, span = size, (first, ends[size])
                break
    return "\n".join(lines[span[0]:span[1] + 1])


def _returns(node: ast.AST) -> bool:
    return any(isinstance(child, ast.Return) for child in ast.walk(node))


def _identifiers(node: ast.AST) -> set[str]:
    """The names a definition mentions: every identifier in it (tree-sitter's ``identifier`` nodes: names read or
    written, attribute and parameter names, keyword arguments, imported names; inside f-strings too)."""
    found = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            found.add(child.id)
        elif isinstance(child, ast.Attribute):
            found.add(child.attr)
        elif isinstance(child, ast.arg):
            found.add(child.arg)
        elif isinstance(child, ast.keyword) and child.arg:
            found.add(child.arg)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(child.name)
        elif isinstance(child, ast.alias):
            found.update(part for part in ((child.asname or child.name).split(".")))
    return found


def _assigned_name(node: ast.stmt) -> str | None:
    """The name an assignment statement defines (its first target's, when that is a plain name), else None."""
    target = node.targets[0] if isinstance(node, ast.Assign) else node.target
    return target.id if isinstance(target, ast.Name) else None


def _definitions(tree: ast.Module) -> Iterator[tuple[str, str | None, ast.stmt]]:
    """``(kind, name, node)`` of the top-level statements step 2 considers, in order: imports, classes, functions,
    assignments."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue  # tree-sitter reads it as a statement of its own kind, which the sanitiser does not keep
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield "import", None, node
        elif isinstance(node, ast.ClassDef) and not node.decorator_list:
            yield "class", node.name, node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.decorator_list:
            yield "function", node.name, node
        elif isinstance(node, ast.Assign) or (isinstance(node, ast.AnnAssign) and node.simple):
            yield "assignment", _assigned_name(node), node


def sanitize(text: str, entry_point: str | None = None) -> str:
    """A response's code as evalplus's sanitiser gives it (see the module docstring): the imports, then the
    definitions kept, each as written, one per line."""
    code = longest_code_span(text)
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return ""
    imports, kept, seen = [], [], set()
    for kind, name, node in _definitions(tree):
        source = ast.get_source_segment(code, node) or ""
        if kind == "import":
            imports.append(source)
        elif name not in seen and (kind != "function" or _returns(node)):
            kept.append((name, source, node))
            seen.add(name)
    if entry_point:
        mentions = {name: _identifiers(node) for name, _, node in kept}
        reached, queue = {entry_point}, [entry_point]
        while queue:
            for other in mentions.get(queue.pop(0), ()):
                if other not in reached:
                    reached.add(other)
                    queue.append(other)
        kept = [(name, source, node) for name, source, node in kept if name in reached]
    return "\n".join(imports + [source for _, source, _ in kept])


def defines_name(code: str, name: str) -> bool:
    """Whether ``code`` (sanitised) defines ``name`` at its top level: a function, a class or an assignment."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return any(definition == name for kind, definition, _ in _definitions(tree) if kind != "import")
