"""``per_sequence_loss`` lives in :mod:`leanbatch.losses` (one convention for every part of leanbatch).

Example:
    >>> from leanbatch.selection.losses import per_sequence_loss
"""

from leanbatch.losses import per_sequence_loss

__all__ = ["per_sequence_loss"]
