"""The built-in image task: in-memory image data, a small CNN or compact ResNet, its presets.

:mod:`~leanbatch.tasks.images.data` and :mod:`~leanbatch.tasks.images.userdata` read the data
(bundled MNIST digits and scikit-learn digits, an ``.npz``, CIFAR-10 batches, an ImageFolder),
:mod:`~leanbatch.tasks.images.models` holds the models, :mod:`~leanbatch.tasks.images.config` what
every arm shares, :mod:`~leanbatch.tasks.images.task` the training function written against the run
contract (:class:`~leanbatch.tasks.images.task.ImageTask`) and the checks before anything trains,
:mod:`~leanbatch.tasks.images.loop` augmentation, evaluation and the warm-up,
:mod:`~leanbatch.tasks.images.irreducible` RHO-LOSS's holdout model, and
:mod:`~leanbatch.tasks.images.presets` ``--quick`` and ``--preset cifar10``. Needs the ``bench``
extra: ``pip install "leanbatch[bench]"``.

Example:
    >>> from leanbatch.tasks.images.presets import PRESETS
    >>> sorted(PRESETS)
    ['cifar10', 'quick']
"""
