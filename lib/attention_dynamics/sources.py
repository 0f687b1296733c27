"""Which library source files a computation depends on: the modules a chapter's notebook (or
a module) imports, and the modules those import, transitively (imports inside functions
included), with the non-Python sources of the packages among them (the C kernels of
``native``). The runner's cache key of a chapter covers these and nothing else, so that
editing the runner, the scorecard page or the provenance footer re-executes no chapter, and
editing a module re-executes exactly the chapters that import it; the key of a stored
trained model (:mod:`attention_dynamics.artifacts`) covers those of its training code."""
from __future__ import annotations

import ast
import functools
import hashlib
import re
from pathlib import Path

__all__ = ["PACKAGE", "PACKAGE_DIR", "PLUMBING", "chapter_modules", "module_closure", "module_digest",
           "imported_modules", "imports_at_run", "notebook_code"]

PACKAGE = "attention_dynamics"
PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_SUFFIXES = (".c", ".h")  # compiled on the reader's machine; they change results too
# The store's plumbing moves bytes and computes nothing: the trained-model store and where
# it is, files written whole, and these keys themselves. A key that covered them would retrain every
# stored model (some 15,000 CPU-seconds) and re-execute every chapter for a better lock or
# a log line, so no closure enters them; what they import for a computation (the kernels'
# paths) is reached through the code that computes.
PLUMBING = frozenset({f"{PACKAGE}.artifacts", f"{PACKAGE}.files", f"{PACKAGE}.sources", f"{PACKAGE}.store"})


def _module_file(dotted: str) -> Path | None:
    """The file of a module of the package (a package resolves to its __init__.py)."""
    parts = dotted.split(".")
    if parts[0] != PACKAGE:
        return None
    base = PACKAGE_DIR.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_names(tree: ast.AST, current: str | None) -> set[str]:
    """Dotted names of every module of the package an AST imports; ``current``: the importing
    module's own dotted name, to resolve relative imports."""
    return {n for n in imported_modules(tree, current) if n == PACKAGE or n.startswith(PACKAGE + ".")}


def imported_modules(tree: ast.AST, current: str | None, *, in_functions: bool = True) -> set[str]:
    """Dotted names of every module an AST imports, of any package (``from pkg import name``
    gives ``pkg`` and ``pkg.name``, which may be a module); ``current``: the importing
    module's own dotted name, to resolve relative imports (left out without it).
    ``in_functions=False``: only the imports that run when the code runs, not those inside a
    function body, which may never be called."""
    names, todo = set(), [tree]
    while todo:
        node = todo.pop()
        if not in_functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if current is None:
                    continue
                package = current.split(".")
                if not _is_package(current):
                    package = package[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
        todo.extend(ast.iter_child_nodes(node))
    return names


def _is_package(dotted: str) -> bool:
    f = _module_file(dotted)
    return f is not None and f.name == "__init__.py"


def _parents(dotted: str) -> list[str]:
    """A module's enclosing packages, whose __init__ runs when it is imported."""
    parts = dotted.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def chapter_modules(notebook: Path) -> list[Path]:
    """The library files a chapter's notebook imports, transitively, sorted."""
    source = notebook_code(notebook)
    try:
        names = _imported_names(ast.parse(source), None)
    except SyntaxError:  # a cell that does not parse: fall back to the import lines
        names = set(re.findall(rf"^\s*(?:from|import)\s+({PACKAGE}[\w.]*)", source, re.M))
    return module_closure(names)


def notebook_code(notebook: Path) -> str:
    """A notebook's code cells as one Python text, without the IPython magics and shell lines
    (``%``, ``!``), which do not parse."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    return "\n".join(l for l in source.splitlines() if not l.lstrip().startswith(("%", "!")))


def module_closure(names) -> list[Path]:
    """The files of the package's modules ``names`` (dotted), of their enclosing packages
    and of everything they import, transitively, with the packages' non-Python sources;
    sorted. The store's plumbing (:data:`PLUMBING`) is neither included nor entered."""
    files = set(_reached(names, in_functions=True, plumbing=False)[0].values())
    for f in list(files):
        if f.name == "__init__.py":
            files.update(p for p in f.parent.iterdir() if p.suffix in SOURCE_SUFFIXES)
    return sorted(files)


def imports_at_run(notebook: Path) -> set[str]:
    """Every module (dotted, of any package) that running the notebook imports: its code's
    imports and those of the package's modules they reach, transitively, the plumbing's too,
    outside function bodies, which may never be called (empty where a cell does not parse).
    What the package's modules import through other packages (seaborn's own imports) is not
    followed."""
    try:
        names = imported_modules(ast.parse(notebook_code(notebook)), None, in_functions=False)
    except SyntaxError:
        return set()
    return _reached(names, in_functions=False, plumbing=True)[1]


def _reached(names, *, in_functions: bool, plumbing: bool) -> tuple[dict[str, Path], set[str]]:
    """From the modules ``names``: the package's modules reached (dotted name -> file), with
    their enclosing packages, through the imports of each (``in_functions``: those inside
    function bodies too; ``plumbing``: the plumbing's entered too), and every name imported
    on the way, ``names`` among them."""
    todo, seen, imported = set(names), {}, set(names)
    while todo:
        name = todo.pop()
        for dotted in [*_parents(name), name]:
            f = _module_file(dotted)
            if f is None or dotted in seen or (dotted in PLUMBING and not plumbing):
                continue
            seen[dotted] = f
            found = _file_imports(f.read_text(encoding="utf-8"), dotted, in_functions)
            imported |= found
            todo |= {n for n in found if n == PACKAGE or n.startswith(PACKAGE + ".")} - set(seen)
    return seen, imported


# A stored model's key reads the imports of some 20 modules. Parsing each text was its first
# cost; once the parse was kept, walking each tree for its imports was most of the rest (the
# modules of a wind-tunnel model's key found in 12 ms, 2 ms with the walk kept too, on an
# Intel Xeon 6/167; a quick book makes some 90 models, the suite many more): each text is
# parsed and walked once per process, looked up by the text itself, so an edited file is
# read anew.
@functools.lru_cache(maxsize=2048)
def _file_imports(text: str, dotted: str, in_functions: bool) -> frozenset[str]:
    """:func:`imported_modules` of a module's text (``dotted``: its own name)."""
    return frozenset(imported_modules(_tree(text), dotted, in_functions=in_functions))


@functools.lru_cache(maxsize=1024)
def _tree(text: str) -> ast.AST:
    """The AST of a module's text, to read its imports (never to change it)."""
    return ast.parse(text)


def _code_without_prose(path: Path) -> bytes:
    """A Python file as the interpreter sees it, without its docstrings: the AST minus the
    docstrings, dumped. Editing a docstring, a comment or the layout changes no result, so it
    should retrain no model and re-execute no chapter (a map in a package's ``__init__`` would
    otherwise invalidate every stored model)."""
    return _dump_without_prose(path.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=1024)
def _dump_without_prose(text: str) -> bytes:
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, include_attributes=False).encode()


def module_digest(files: list[Path]) -> str:
    """SHA-256 over the files' paths (relative to the package) and contents: Python files
    without their prose (:func:`_code_without_prose`), other sources (C) byte for byte."""
    h = hashlib.sha256()
    for p in sorted(files):
        h.update(p.relative_to(PACKAGE_DIR).as_posix().encode())
        h.update(_code_without_prose(p) if p.suffix == ".py" else p.read_bytes())
    return h.hexdigest()
