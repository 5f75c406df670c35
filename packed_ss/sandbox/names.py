"""What names a piece of Python binds and reads, so that the judge knows what the tests take from the solution.

Pure functions on source text; a text that does not parse gets a regex guess or nothing, never an exception.
"""

from __future__ import annotations

UNPARSABLE = (SyntaxError, RecursionError, ValueError, MemoryError)  # ast.parse on a hostile text (ValueError: NUL)


def free_names(tests: str, context: str = "", entry=()) -> tuple[str, ...]:
    """Names ``tests`` read that neither it, ``context`` nor the builtins bind: what it takes from the solution.
    A builtin's name in ``entry`` (the functions the task asks for, e.g. an MBPP function named ``sum``) is the
    solution's too: it is what the tests test. Any other builtin stays Python's own, so a response cannot redefine
    what the tests use (``set = lambda *a: 0``). Empty when ``tests`` does not parse (the judge then reports the
    syntax error)."""
    import ast
    import builtins

    try:
        trees = [ast.parse(tests), ast.parse(context)]
    except UNPARSABLE:
        return ()
    shadowed = set(entry) & set(dir(builtins))
    read, bound = [], set(dir(builtins)) - shadowed
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.Name):
            (read.append(node.id) if isinstance(node.ctx, ast.Load) else bound.add(node.id))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    return tuple(dict.fromkeys(name for name in read if name not in bound))


def top_level_names(code: str) -> set[str]:
    """Top-level names that ``code`` defines or imports (a regex guess where it does not parse)."""
    import ast
    import re

    try:
        tree = ast.parse(code)
    except UNPARSABLE:
        return {a or b for a, b in re.findall(r"^(?:def|class)\s+(\w+)|^(\w+)\s*=", code, re.MULTILINE)}
    return {name for node in tree.body for name in statement_names(node)}


def statement_names(node) -> list[str]:
    """The names one top-level statement binds: a function or class, assignment targets, imports."""
    import ast

    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    return []
