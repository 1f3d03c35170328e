"""The one rule by which the package's objects own the library's: a
:class:`Buffer` its memory, a :class:`Group` its ``symmem_group*``, a
:class:`Handle` its ``symmem_handle*``.

Such an object holds an :class:`Owned` for what it owns. The C object is
closed once: by the owner's explicit call (``free``, ``destroy``,
``release``), which takes the :class:`Owned` and reports the library's
error, or else when the owner is collected, quietly (a collector cannot
raise to anyone). Nothing is closed once the interpreter exits: the
process's objects go with it, and the library may already be shutting down.
"""

from __future__ import annotations

import atexit
from typing import Any, Callable, Optional, Tuple

_exiting = False


def _at_exit() -> None:
    global _exiting
    _exiting = True


atexit.register(_at_exit)


class Owned:
    """``close(*args)`` is owed once. :meth:`take` hands the arguments to
    the one caller that closes it now; if no one has when this object goes
    (with its owner, which is the only one to hold it), it is called then,
    its errors dropped. Small and made in one step: a Handle is made and
    dropped per rendezvous again."""

    __slots__ = ("_close", "_args")

    def __init__(self, close: Callable[..., Any], *args: Any) -> None:
        self._close: Optional[Callable[..., Any]] = close
        self._args = args

    @property
    def alive(self) -> bool:
        """Whether the close is still owed."""
        return self._close is not None

    def take(self) -> Optional[Tuple[Any, ...]]:
        """The close's arguments, once: None when taken before (closed)."""
        if self._close is None:
            return None
        self._close = None
        return self._args

    def __del__(self) -> None:
        close = self._close
        if close is None or _exiting:
            return
        self._close = None
        try:
            close(*self._args)
        except Exception:  # pragma: no cover - collected: there is no one to tell
            pass
