"""``python -m coordinator``: the same command line as the ``coordinator`` script (handy
where the venv's ``bin`` is not on ``PATH``)."""

import sys

from coordinator.cli import main

sys.exit(main())
