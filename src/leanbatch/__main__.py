"""``python -m leanbatch``: the same as the ``leanbatch`` console script."""

import sys

from leanbatch.cli import main

sys.exit(main())
