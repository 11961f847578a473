"""The benchmark behind the ``leanbatch`` command: data, models, the measured loop, reports, plots.

One concept per module: :mod:`~leanbatch.bench.data` (in-memory datasets),
:mod:`~leanbatch.bench.models` (small CNN, compact ResNet), :mod:`~leanbatch.bench.registry`
(every method kind, once: family, description, settings, how to build the library's objects),
:mod:`~leanbatch.bench.methods` (the rows of a comparison: ``--methods`` parsed and validated),
:mod:`~leanbatch.bench.config` (what every method shares), :mod:`~leanbatch.bench.train` (the
training loop used for measurement), :mod:`~leanbatch.bench.selecting` (its batch-level selection),
:mod:`~leanbatch.bench.loop_parts` (augmentation, evaluation, warm-up, histograms),
:mod:`~leanbatch.bench.records` (what a run records), :mod:`~leanbatch.bench.frontier` (the baseline trained shorter and the
equal-time comparison), :mod:`~leanbatch.bench.presets` (``--preset quick|cifar10`` and the
budget runs), :mod:`~leanbatch.bench.report` (tables and results.json),
:mod:`~leanbatch.bench.plots` (PNG figures), :mod:`~leanbatch.bench.micro` (micro-benchmarks).
Needs the ``bench`` extra: ``pip install 'leanbatch[bench]'``.
"""
