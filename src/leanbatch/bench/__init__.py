"""The benchmark behind the ``leanbatch`` command: data, models, the measured loop, reports, plots.

One concept per module: :mod:`~leanbatch.bench.data` (in-memory datasets),
:mod:`~leanbatch.bench.models` (small CNN, compact ResNet), :mod:`~leanbatch.bench.methods`
(what is compared and its hyperparameters), :mod:`~leanbatch.bench.train` (the training loop
used for measurement), :mod:`~leanbatch.bench.report` (table and results.json),
:mod:`~leanbatch.bench.plots` (PNG figures), :mod:`~leanbatch.bench.micro` (micro-benchmarks).
Needs the ``bench`` extra: ``pip install 'leanbatch[bench]'``.
"""
