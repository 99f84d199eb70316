"""``python -m disco``: the command line (``disco.cli``)."""

import sys

from disco.cli import main

if __name__ == "__main__":
    sys.exit(main())
