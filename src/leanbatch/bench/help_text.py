"""The epilog of ``leanbatch bench --help``: every method kind in one line, its settings, its twin.

Example:
    >>> print(methods_help().splitlines()[1].split()[:2])
    ['baseline', 'baseline']
"""

from __future__ import annotations

from leanbatch.bench.registry import REGISTRY

__all__ = ["methods_help"]


def methods_help() -> str:
    """The kinds and their settings, for ``leanbatch bench --help``: one line per kind (name, family:
    what it does), then each kind's settings with their defaults and old spellings, then the
    uniform twin ``--controls`` runs beside each method that has one.

    Example:
        >>> text = methods_help()
        >>> "rho-loss" in text and "sb -> sb~uniform (uniform with" in text
        True
    """
    lines = [
        "method kinds (--methods NAME or NAME[setting=value,...]; a bracketed item is a row of its own):"
    ]
    lines += [f"  {k.name:<17} {k.family:<10} {k.description}" for k in REGISTRY.values()]
    lines += [
        "",
        "settings (the library's names and the papers' defaults; old spellings in parentheses work too):",
    ]
    for k in REGISTRY.values():
        rows = _pack([s.describe() for s in k.settings], 88)
        lines += [f"  {k.name:<17} {rows[0]}", *(f"  {'':<17} {r}" for r in rows[1:])]
    lines += [
        "",
        "--prune-ratio, --delta, --sb-* and --stack-scores set the setting of that old spelling in every row",
        "that has it; max_weight and final_pressure take none (or 0) for off; il_epochs none: the run's epochs.",
        "",
        "uniform twins (--controls runs each beside its method: what the choosing buys is the difference):",
    ]
    for k in REGISTRY.values():
        if k.twin is not None:
            fixed = ",".join(f"{name}={'none' if v is None else f'{v:g}'}" for name, v in k.twin.fixed)
            made = f"{k.twin.kind}[{fixed}]" if fixed else k.twin.kind
            lines.append(f"  {k.name} -> {k.name}~{k.twin.name} ({made} with the method's other settings)")
    return "\n".join(lines)


def _pack(items: list[str], width: int) -> list[str]:
    """``items`` joined by commas into lines of at most ``width`` characters, never splitting one.

    Example:
        >>> _pack(["a=1", "b=2", "c=3"], 8)
        ['a=1, b=2,', 'c=3']
    """
    lines = [items[0]]
    for item in items[1:]:
        if len(lines[-1]) + 2 + len(item) > width:
            lines[-1] += ","
            lines.append(item)
        else:
            lines[-1] += ", " + item
    return lines
