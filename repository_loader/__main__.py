"""``python -m repository_loader validate <repo>``: the same command as ``triton-serve``."""

import sys

from repository_loader.cli import main

sys.exit(main())
