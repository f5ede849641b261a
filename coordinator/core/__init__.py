"""The pure core: deadlines, the refresh coalescer and admission.

Layering: nothing here does I/O, reads a clock or imports from the rest of the package;
the shell (store, listener, executors, daemon) passes time in (trio seconds for the
coalescer, wall-clock epoch seconds for deadlines and admission order) and acts on
the answers. That is what lets ``tests/unit`` drive it with ``trio.testing.MockClock``.
"""

from .admission import Admission as Admission
from .admission import Coverage as Coverage
from .admission import Priority as Priority
from .admission import Ticket as Ticket
from .coalescer import RefreshCoalescer as RefreshCoalescer
from .deadlines import DeadlineSet as DeadlineSet

__all__ = ["Admission", "Coverage", "DeadlineSet", "Priority", "RefreshCoalescer", "Ticket"]
