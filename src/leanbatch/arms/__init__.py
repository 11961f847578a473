"""The arms a study can run: every method registered once, how ``--methods`` writes them, their twins.

:mod:`~leanbatch.arms.registry` holds every method kind (its family, settings with the papers'
defaults, how to build the library's policy or selector from them, its uniform twin);
:mod:`~leanbatch.arms.methods` parses ``--methods`` and the baseline's budgets into
:class:`~leanbatch.arms.methods.Arm` s; :mod:`~leanbatch.arms.twins` adds each choosing arm's
uniform twin (``--controls``). The engine (:mod:`leanbatch.engine`) runs them on a task.

Example:
    >>> from leanbatch.arms.methods import parse_methods
    >>> [a.label for a in parse_methods("baseline,infobatch")]
    ['baseline', 'infobatch']
"""
