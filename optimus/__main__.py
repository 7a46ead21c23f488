"""``python -m optimus_lens ...``: the ``optimus`` command (see :mod:`optimus_lens.cli`)."""

import sys

from optimus_lens.cli import main

sys.exit(main())
