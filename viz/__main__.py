"""``python -m optimus_lens.viz TRACE -o report.html``: write the HTML report of a trace (:func:`viz.report.main`)."""

import sys

from optimus_lens.viz.report import main

sys.exit(main())
