"""docs/architecture.md stays true: its modules exist, every module is in it, its layering is the
import graph, the graph has no cycle, the public names have one home, and no module or function
outgrows its size.

Everything here reads the source with :mod:`ast` (nothing is imported), so the checks cost a few
hundred milliseconds. The import graph counts every ``import`` and ``from ... import`` a module
holds: at its top, inside functions (local imports), under ``if TYPE_CHECKING:``, and the string
literal a call is given when it names a leanbatch module (``import_with_extra("leanbatch.x", ...)``).
An edge goes to the module named (``from leanbatch.a import b``: to ``leanbatch.a.b`` when that is
a module, else to ``leanbatch.a``, a package's ``__init__.py``); ``from leanbatch import X`` goes to
the module that is ``X``'s home in ``leanbatch._HOME``, not to the whole package.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "leanbatch"
DOC = ROOT / "docs" / "architecture.md"

MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
ARGPARSE_TABLE = 5  # a function making at least this many .add_argument(...) calls is an argparse table


# ---------------------------------------------------------------------------- the package
def modules(pkg: Path = PKG) -> dict[str, Path]:
    """Every module of the package by its path relative to ``src/leanbatch`` (``distributed/carrier.py``)."""
    return {p.relative_to(pkg).as_posix(): p for p in sorted(pkg.rglob("*.py"))}


def dotted(rel: str) -> str:
    """``distributed/carrier.py`` -> ``leanbatch.distributed.carrier``; ``__init__.py`` -> ``leanbatch``."""
    parts = ["leanbatch", *rel[: -len(".py")].split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def public_homes(pkg: Path = PKG) -> dict[str, str]:
    """``leanbatch._HOME``, read from ``__init__.py``'s source: public name -> its home module."""
    for node in tree(pkg / "__init__.py").body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_HOME" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("src/leanbatch/__init__.py has no _HOME = {...}")


def _named(names: dict[str, str], mod: str) -> str | None:
    """The module ``mod`` names: itself, or the nearest package above it (``leanbatch.a.X`` -> ``leanbatch.a``)."""
    while mod:
        if mod in names:
            return mod
        mod = mod.rpartition(".")[0]
    return None


def _imported(rel: str, names: dict[str, str], homes: dict[str, str], path: Path) -> set[str]:
    """The dotted names of the leanbatch modules that module ``rel`` imports (see the module docstring)."""
    me = dotted(rel)
    package = me if rel.endswith("__init__.py") else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Import):
            found.update(filter(None, (_named(names, a.name) for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # a relative import
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            for a in node.names:
                if base == "leanbatch" and a.name in homes:
                    found.add(homes[a.name])
                elif f"{base}.{a.name}" in names:
                    found.add(f"{base}.{a.name}")
                elif (target := _named(names, base)) is not None:
                    found.add(target)
        elif isinstance(node, ast.Call):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value in names:
                    found.add(arg.value)
    found.discard(me)
    return found


def import_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """Module path -> the module paths it imports (all leanbatch imports, see the module docstring)."""
    mods = modules(pkg)
    names = {dotted(rel): rel for rel in mods}
    homes = public_homes(pkg)
    return {rel: {names[m] for m in _imported(rel, names, homes, path)} for rel, path in mods.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (``[a, b, ..., a]``), or ``None``."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := walk(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := walk(start)) is not None:
            return found
    return None


# ---------------------------------------------------------------------------- the document
MODULE_PATH = re.compile(r"[A-Za-z_][\w/]*\.py|[A-Za-z_][\w/]*/")


def doc_text(doc: Path = DOC) -> str:
    return doc.read_text()


def layers_block(text: str) -> str:
    blocks = re.findall(r"^```layers\n(.*?)^```", text, flags=re.S | re.M)
    assert len(blocks) == 1, "docs/architecture.md needs exactly one ```layers block"
    return blocks[0]


def layers(text: str) -> list[tuple[str, list[str]]]:
    """The ```layers block: ``name: entry entry ...`` per line, top layer first (``#`` starts a comment)."""
    out = []
    for line in layers_block(text).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, entries = line.partition(":")
            assert sep and entries.split(), f"a layer line is 'name: module.py package/ ...', got {line!r}"
            out.append((name.strip(), entries.split()))
    assert len(out) >= 2, "the ```layers block names no layers"
    return out


def named_paths(text: str) -> set[str]:
    """The module paths the prose and tables name in backticks (``sampler.py``, ``distributed/``)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return {c for c in re.findall(r"`([^`\n]+)`", prose) if MODULE_PATH.fullmatch(c)}


def matches(entry: str, rel: str) -> bool:
    return rel.startswith(entry) if entry.endswith("/") else rel == entry


def layer_of(text: str, mods: dict[str, Path]) -> tuple[dict[str, int], list[str]]:
    """Module path -> its layer's index (0 = top), and the problems (a module in no layer or in two)."""
    table = layers(text)
    where: dict[str, int] = {}
    problems = []
    for rel in mods:
        found = [(i, e) for i, (_, entries) in enumerate(table) for e in entries if matches(e, rel)]
        if len(found) != 1:
            problems.append(f"{rel}: in {len(found)} layer entries {[e for _, e in found]}, not 1")
        elif found:
            where[rel] = found[0][0]
    return where, problems


def upward(text: str, graph: dict[str, set[str]], mods: dict[str, Path]) -> list[str]:
    """Every import from a lower layer to a higher one: ``a.py (layer) -> b.py (layer)``."""
    where, _ = layer_of(text, mods)
    names = [n for n, _ in layers(text)]
    return sorted(
        f"{a} ({names[where[a]]}) imports {b} ({names[where[b]]})"
        for a, targets in graph.items()
        for b in targets
        if a in where and b in where and where[b] < where[a]
    )


def owners_rows(text: str) -> list[tuple[str, str]]:
    """The owners table's (owner cell, module cell) per row."""
    lines = text.splitlines()
    head = next(
        i for i, line in enumerate(lines) if re.match(r"\|\s*state\s*\|\s*owner\s*\|\s*module\s*\|", line)
    )
    rows = []
    for line in lines[head + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append((cells[1], cells[2]))
    return rows


def defines(path: Path, name: str) -> bool:
    """Whether the module at ``path`` defines ``name`` (``Class``, ``function``, ``NAME``, ``Class.attr``;
    ``check_*`` for any top-level name the pattern matches)."""
    top = tree(path).body

    def names(body: list[ast.stmt]) -> set[str]:
        out = set()
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(node.name)
            elif isinstance(node, ast.Assign):
                out.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out.add(node.target.id)
        return out

    cls, _, attr = name.partition(".")
    if not attr:
        return any(fnmatch.fnmatchcase(n, name) for n in names(top))
    return any(isinstance(n, ast.ClassDef) and n.name == cls and attr in names(n.body) for n in top)


def owner_problems(text: str, mods: dict[str, Path]) -> list[str]:
    problems = []
    for owner, module in owners_rows(text):
        paths = [m for m in re.findall(r"`([^`]+)`", module) if m in mods]
        assert paths, f"owners row {owner!r}: its module cell names no module ({module!r})"
        for name in re.findall(r"`([^`]+)`", owner):
            name = name.removesuffix("()")
            if not re.fullmatch(r"[A-Za-z_][\w*]*(\.[A-Za-z_]\w*)?", name):
                continue  # prose in backticks, not a name
            if not any(defines(mods[p], name) for p in paths):
                problems.append(f"{name} is defined in none of {paths}")
    return problems


# ---------------------------------------------------------------------------- size
def _argparse_table(fn: ast.AST) -> bool:
    calls = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument"
    ]
    return len(calls) >= ARGPARSE_TABLE


def too_long(mods: dict[str, Path]) -> list[str]:
    """Modules over :data:`MAX_MODULE_LINES` lines, functions over :data:`MAX_FUNCTION_LINES`
    (``end_lineno - lineno + 1``: from the ``def`` line to the last, docstring included).

    Exempt functions: a name containing ``parser`` (``build_parser``, ``_bench_parser``), or a body
    making at least :data:`ARGPARSE_TABLE` ``.add_argument(...)`` calls: an argparse table, which is
    long because it is a list of options, not because it does much.
    """
    out = []
    for rel, path in mods.items():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            out.append(f"{rel}: {lines} lines")
        for fn in ast.walk(tree(path)):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = fn.end_lineno - fn.lineno + 1  # type: ignore[operator]
                exempt = "parser" in fn.name or _argparse_table(fn)
                if length > MAX_FUNCTION_LINES and not exempt:
                    out.append(f"{rel}:{fn.lineno} {fn.name}(): {length} lines")
    return out


# ---------------------------------------------------------------------------- the tests
def test_every_module_the_doc_names_exists():
    """(a) A module path in backticks, or an entry of the layering, is a file or package of the package."""
    mods = modules()
    dirs = {rel.rpartition("/")[0] + "/" for rel in mods if "/" in rel}
    text = doc_text()
    named = named_paths(text) | {e for _, entries in layers(text) for e in entries}
    missing = sorted(p for p in named if p not in mods and p not in dirs)
    assert missing == [], f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_module_is_in_the_doc():
    """(b) Every module appears in the doc's prose or tables by its path (a package's ``__init__.py``
    by the package, ``distributed/``), and in exactly one layer."""
    mods = modules()
    text = doc_text()
    named = named_paths(text)
    absent = sorted(
        rel
        for rel in mods
        if rel not in named
        and not (rel.endswith("/__init__.py") and rel.removesuffix("__init__.py") in named)
    )
    assert absent == [], f"modules docs/architecture.md does not name: {absent}"
    assert layer_of(text, mods)[1] == [], "\n".join(layer_of(text, mods)[1])


def test_the_layering_is_the_import_graph():
    """(c) No module imports one of a higher layer (every import counts: see the module docstring)."""
    text, mods = doc_text(), modules()
    assert layer_of(text, mods)[1] == [], "\n".join(layer_of(text, mods)[1])
    bad = upward(text, import_graph(), mods)
    assert bad == [], "imports against the layering of docs/architecture.md:\n" + "\n".join(bad)


def test_the_import_graph_has_no_cycle():
    """(d) The modules import one another without a cycle (local and TYPE_CHECKING imports count)."""
    found = cycle(import_graph())
    assert found is None, "an import cycle: " + " -> ".join(found or [])


def test_the_public_names_have_one_home():
    """(e) ``__init__.py``: the ``TYPE_CHECKING`` imports are exactly ``_HOME``, ``__all__`` is
    ``sorted(_HOME)``, and each name is defined in its home."""
    homes = public_homes()
    body = tree(PKG / "__init__.py").body
    guarded = [n for n in body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING"]
    assert len(guarded) == 1
    seen = [
        (a.asname or a.name, n.module)
        for n in guarded[0].body
        if isinstance(n, ast.ImportFrom)
        for a in n.names
    ]
    assert len(seen) == len(dict(seen)) and dict(seen) == homes
    all_ = [
        n
        for n in body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets)
    ]
    assert len(all_) == 1 and ast.unparse(all_[0].value) == "sorted(_HOME)"
    mods = modules()
    by_name = {dotted(rel): path for rel, path in mods.items()}
    assert [n for n, home in homes.items() if not defines(by_name[home], n)] == []


def test_the_owners_table_names_what_its_modules_define():
    """The owners table: each owner in backticks is defined in the module its row names."""
    bad = owner_problems(doc_text(), modules())
    assert bad == [], "docs/architecture.md's owners table:\n" + "\n".join(bad)


def test_no_module_or_function_outgrows_its_size():
    """(f) No module over 450 lines, no function over 60 (see :func:`too_long` for the exemption)."""
    bad = too_long(modules())
    assert bad == [], "over the size limits:\n" + "\n".join(bad)
