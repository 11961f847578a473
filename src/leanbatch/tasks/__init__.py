"""Tasks the engine ships: the built-in image task (:mod:`leanbatch.tasks.images`), one task among others.

Your own task is a function ``train(run) -> metric`` (see :mod:`leanbatch.engine.running.run`), given to
``leanbatch bench --task path/to/file.py:train``.
"""
