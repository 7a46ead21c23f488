"""``python -m viz TRACE -o report.html``: write the HTML report of a trace (:func:`viz.report.main`)."""
import sys

from viz.report import main

sys.exit(main())
