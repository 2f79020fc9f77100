"""`python -m trimtab`: the command line, as the `trimtab` script runs it."""

import sys

from trimtab.cli import main

if __name__ == "__main__":
    sys.exit(main())
