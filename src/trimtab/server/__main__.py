"""`python -m trimtab.server`: the same command as `trimtab serve` (see `command`)."""

import sys

from trimtab.server.command import main

if __name__ == "__main__":
    sys.exit(main())
