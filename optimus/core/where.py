"""Where code lives: ``path:line`` of a definition, of a caller or of the line that raised, as the viewer shows it.

A path inside the checkout the package was installed from (an editable install) is
given relative to the checkout's root (``optimus/passes/batch.py:120``); inside an
installed package, relative to the folder holding ``optimus_lens``
(``optimus_lens/passes/batch.py:120``); anywhere else, as it is (a user's pattern file).
Links of an editable install are followed to the real file first.
"""

from __future__ import annotations

import inspect
import os
import sys
import traceback
from pathlib import Path
from typing import Any

#: the real folder of this package (optimus/ in a checkout, .../optimus_lens when installed)
_PACKAGE = Path(os.path.realpath(__file__)).parent.parent
_ROOT = _PACKAGE.parent


def shown_path(file: str | os.PathLike) -> str:
    """``file`` as the viewer names it: relative to the checkout (or the installed
    package's parent folder) when inside it, else unchanged."""
    path = Path(os.path.realpath(file))
    try:
        return path.relative_to(_ROOT).as_posix()
    except ValueError:
        return str(file)


def source_of(obj: Any) -> str:
    """``path:line`` where ``obj`` (a class, function or method) is defined; "" when Python
    cannot say (a builtin, code typed at a prompt)."""
    try:
        file = inspect.getsourcefile(obj)
        _, line = inspect.getsourcelines(obj)
    except (TypeError, OSError):
        return ""
    if file is None:
        return ""
    return f"{shown_path(file)}:{line}"


def caller(depth: int = 1) -> str:
    """``path:line`` of the frame ``depth`` levels above the caller of this function (0:
    the caller itself): the ``source`` of a rule defined at module level."""
    f = sys._getframe(depth + 1)
    return f"{shown_path(f.f_code.co_filename)}:{f.f_lineno}"


def raised_in(cls: type, e: BaseException) -> str:
    """``path:line`` (named as :func:`source_of` names ``cls``'s file) of the innermost
    frame of ``e``'s traceback in the file that defines ``cls``: where a pattern's own
    code raised. "" when no frame is in that file, or Python cannot say which file it is."""
    try:
        file = inspect.getsourcefile(cls)
    except TypeError:
        return ""
    line = None
    for fr in traceback.extract_tb(e.__traceback__):
        if file and fr.filename == file:
            line = fr.lineno
    if line is None:
        return ""
    rel = source_of(cls).split(":")[0]
    return f"{rel}:{line}" if rel else f"{file}:{line}"
