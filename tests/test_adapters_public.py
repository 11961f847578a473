"""The adapters are thin wiring over the core's public interface: no module of ``leanbatch.lightning``
or ``leanbatch.hf`` imports a private (``_``) name from the core or reads a private attribute of any
object but its own (``self``/``cls``, and ``super()``: the framework hooks it overrides). The two framework-side names they touch are listed, with why."""

from __future__ import annotations

import ast
from pathlib import Path

import leanbatch

# (module, expression) pairs allowed, each a framework's object, not leanbatch's core:
FRAMEWORK = {
    ("hf/trainer.py", "Trainer._run_epoch"),  # the signature of transformers' epoch loop, checked at import
    ("hf/trainer.py", "sched._leanbatch"),  # our own tag on a transformers LR scheduler (wrapped once)
}


def _private_reads(path: Path, rel: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("leanbatch"):
            found += [
                f"{rel}: imports {a.name} from {node.module}" for a in node.names if a.name.startswith("_")
            ]
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = ast.unparse(node.value)
            if owner not in ("self", "cls", "super()") and (rel, f"{owner}.{node.attr}") not in FRAMEWORK:
                found.append(f"{rel}:{node.lineno}: reads {owner}.{node.attr}")
    return found


def test_the_adapters_use_only_the_cores_public_names() -> None:
    root = Path(leanbatch.__file__).parent
    files = [p for d in ("lightning", "hf") for p in sorted((root / d).glob("*.py"))]
    assert len(files) >= 2
    found = [f for p in files for f in _private_reads(p, p.relative_to(root).as_posix())]
    assert not found, found
