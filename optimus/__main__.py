"""``python -m optimus ...``: the ``optimus`` command (see :mod:`optimus.cli`)."""
import sys

from optimus.cli import main

sys.exit(main())
