"""``python -m deployments validate <repo>`` / ``serve <repo>``: the ``triton-serve`` command."""

import sys

from deployments.cli import main

sys.exit(main())
