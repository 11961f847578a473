"""Collection settings for the whole tree: the Lightning adapter's doctests need the lightning extra."""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("lightning") else ["src/leanbatch/lightning"]
