"""The benchmark behind the ``leanbatch`` command: data, models, the measured loop, reports, plots.

One concept per module: :mod:`~leanbatch.bench.data` (in-memory datasets),
:mod:`~leanbatch.bench.models` (small CNN, compact ResNet), :mod:`~leanbatch.bench.methods`
(what is compared and its hyperparameters), :mod:`~leanbatch.bench.train` (the training loop
used for measurement), :mod:`~leanbatch.bench.selecting` (its batch-level selection),
:mod:`~leanbatch.bench.records` (what a run records), :mod:`~leanbatch.bench.frontier` (the baseline trained shorter and the
equal-time comparison), :mod:`~leanbatch.bench.presets` (``--preset quick|cifar10`` and the
budget runs), :mod:`~leanbatch.bench.report` (tables and results.json),
:mod:`~leanbatch.bench.plots` (PNG figures), :mod:`~leanbatch.bench.micro` (micro-benchmarks).
Needs the ``bench`` extra: ``pip install 'leanbatch[bench]'``.
"""
