"""How a command fails: the exit statuses, and the two exceptions :func:`optimus_lens.cli.main`
turns into a one-line message on stderr and its exit status.

A command returns ``EXIT_OK`` or ``EXIT_VERIFY`` itself; for bad input it raises
:class:`BadInput` (exit 2), for a pattern that raised :class:`PatternRaised` (exit 3).
:func:`input_errors` is the one translation of the library's errors into those two.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

#: 0 ok; 1 a step failed verification or was rolled back; 2 bad input (unknown model, spec or
#: pass, untraceable model, unreadable trace or pattern file, bad option); 3 a pattern (or an
#: observed upstream pass) raised
EXIT_OK, EXIT_VERIFY, EXIT_INPUT, EXIT_PATTERN = 0, 1, 2, 3


class BadInput(Exception):
    """The command's input cannot be used: exit status 2, ``optimus: MESSAGE`` on stderr
    (``optimus report: ...`` / ``optimus lesson: ...`` for those commands)."""


class PatternRaised(Exception):
    """A pattern, or one of PyTorch's observed passes, raised while it ran: exit status 3."""


@contextmanager
def input_errors(*more: type[BaseException]) -> Iterator[None]:
    """Inside the block, the library's bad-input errors become :class:`BadInput` and a
    pattern that raised (:class:`optimus_lens.core.engine.PatternError`) :class:`PatternRaised`,
    with the same message. Bad input is: an unknown or unloadable model spec
    (``ModelSpecError``), a model that cannot be captured (``CaptureError``; for the ATen
    graphs of the post-grad stage, ``AtenCaptureError``), an unreadable
    pattern file (``PatternFileError``), an unknown pass or node (``KeyError``, whose message
    is its first argument), a bad value (``ValueError``), and the types in ``more``."""
    from optimus_lens.core.engine import PatternError
    from optimus_lens.frontend.aten_capture import AtenCaptureError
    from optimus_lens.frontend.capture import CaptureError

    # ModelSpecError and PatternFileError are ValueErrors
    bad: tuple[type[BaseException], ...] = (CaptureError, AtenCaptureError, KeyError, ValueError, *more)
    try:
        yield
    except PatternError as e:
        raise PatternRaised(str(e)) from e
    except bad as e:
        raise BadInput(e.args[0] if isinstance(e, KeyError) else str(e)) from e
