"""``python -m leanbatch``: the same as the ``leanbatch`` console script."""

import sys

try:
    from leanbatch.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command starts: one line, no traceback
    print("leanbatch: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
