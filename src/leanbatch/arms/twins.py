"""The uniform twins: each choosing method's arm beside the same budget spent at random (``--controls``).

Every kind with a :class:`~leanbatch.arms.registry.Twin` has a *twin arm*: the twin's kind with the
settings the two share copied from the method's arm and the twin's ``fixed`` settings on top,
labelled ``<label>~<name>``:

========================  =========================================================================
method                    twin arm
========================  =========================================================================
``infobatch``             ``infobatch~random``: ``random`` (same prune_ratio, delta, ... drawn uniformly)
``sb``, ``sb-proxy``,     ``sb~uniform``...: ``uniform``, ``SelectiveBackprop(rule="uniform")`` with
``rho-loss``              the same keep and window, no selection pass (nor proxy, nor holdout model)
``infobatch+sb``          ``infobatch+sb~uniform``: ``infobatch+uniform`` (its pruning, then uniform)
``obs``, ``obs-epoch``    ``obs~uniform``...: the same kind at ``pressure=1`` (the loss-rank draw uniform)
========================  =========================================================================

An arm whose twin is already among the arms is paired with it rather than run twice, with or
without ``--controls`` (:func:`pair_twins`: ``--methods infobatch,random`` judges ``infobatch``
against ``random``); an arm that is its own twin (``obs[pressure=1]``) gets none. :mod:`leanbatch.engine.judging.controls` judges the pairs.

Example:
    >>> from leanbatch.arms.methods import parse_methods
    >>> [(a.label, a.control) for a in with_controls(parse_methods("baseline,obs[keep=0.7]"))]
    [('baseline', None), ('obs[keep=0.7]', 'obs[keep=0.7]~uniform'), ('obs[keep=0.7]~uniform', None)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from leanbatch.arms.methods import Arm, ArmError, make_arm
from leanbatch.arms.registry import REGISTRY

__all__ = ["pair_twins", "twin_arm", "with_controls"]


def twin_arm(arm: Arm) -> Arm | None:
    """The uniform twin of ``arm``; None when its kind has none or the arm is its own twin."""
    spec = arm.method.twin
    if spec is None:
        return None
    kind = REGISTRY[spec.kind]
    settings = {s.name: arm.settings[s.name] for s in kind.settings if s.name in arm.settings}
    settings.update(dict(spec.fixed))
    if spec.kind == arm.kind and settings == dict(arm.settings):
        return None
    return make_arm(spec.kind, f"{arm.label}~{spec.name}", **settings)


def with_controls(arms: Sequence[Arm]) -> list[Arm]:
    """``arms`` with each one's uniform twin right after it (or an equal arm already there), every
    method naming its twin's label in ``control``; :class:`ArmError` when no arm has a twin.
    """
    out = list(arms)
    for arm in arms:
        twin = twin_arm(arm)
        if twin is not None and _among(out, twin) is None:
            out.insert(out.index(arm) + 1, twin)
    out = pair_twins(out)
    if not any(a.control for a in out):
        have = [k.name for k in REGISTRY.values() if k.twin is not None]
        raise ArmError(
            f"--controls: none of {', '.join(a.label for a in arms)} has a uniform twin to run beside it; "
            f"the methods that have one: {', '.join(have)}"
        )
    return out


def pair_twins(arms: Sequence[Arm]) -> list[Arm]:
    """``arms``, each one whose uniform twin is already among them naming it in ``control``; none added.

    Example:
        >>> from leanbatch.arms.methods import parse_methods
        >>> [(a.label, a.control) for a in pair_twins(parse_methods("baseline,random,infobatch,sb"))]
        [('baseline', None), ('random', None), ('infobatch', 'random'), ('sb', None)]
    """
    out = []
    for arm in arms:
        twin = twin_arm(arm)
        same = None if twin is None else _among(arms, twin)
        out.append(arm if same is None else dataclasses.replace(arm, control=same.label))
    return out


def _among(arms: Sequence[Arm], twin: Arm) -> Arm | None:
    """The arm of ``arms`` that trains as ``twin`` does (its kind and settings), if one does."""
    return next((a for a in arms if a.kind == twin.kind and dict(a.settings) == dict(twin.settings)), None)
