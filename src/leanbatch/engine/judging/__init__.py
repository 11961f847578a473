"""The judging and reporting room: from the runs' records (:mod:`~leanbatch.engine.judging.records`)
to the verdicts (:mod:`~leanbatch.engine.judging.verdicts`, the envelope, the twins), results.json
(:mod:`~leanbatch.engine.judging.results`), the tables, the plots, report.html, and the files
``leanbatch report`` reads and writes. It trains nothing: a stored study is judged again from its runs.

Example:
    >>> import leanbatch.engine.judging
"""
