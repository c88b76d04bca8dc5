"""``python -m project ...``: see project/cli.py."""

import sys

from project.cli import main

if __name__ == "__main__":
    sys.exit(main())
