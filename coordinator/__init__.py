"""coordinator: an idle-silent deadline coordinator for jobs kept in PostgreSQL.

What applications use is re-exported here: the value types, the SQL-API client module,
the worker SDK and the error hierarchy. Everything else lives in private-by-convention
modules whose names say what they hold.

Layering: ``coordinator.core`` (deadlines, coalescer, admission) is pure and imports
nothing from the shell; ``store`` holds every statement the daemon sends; ``daemon``
wires core and shell in one trio nursery; ``service`` assembles a process from config.
"""

from . import client as client
from .errors import ConfigError as ConfigError
from .errors import Conflict as Conflict
from .errors import CoordinatorError as CoordinatorError
from .errors import DatabaseError as DatabaseError
from .errors import DatabaseUnavailable as DatabaseUnavailable
from .errors import InvalidInput as InvalidInput
from .errors import InvalidSchedule as InvalidSchedule
from .errors import JobNotFound as JobNotFound
from .errors import RunNotFound as RunNotFound
from .model import Job as Job
from .model import Outcome as Outcome
from .model import Schedule as Schedule
from .model import Target as Target
from .worker import Context as Context
from .worker import Worker as Worker

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "Conflict",
    "Context",
    "CoordinatorError",
    "DatabaseError",
    "DatabaseUnavailable",
    "InvalidInput",
    "InvalidSchedule",
    "Job",
    "JobNotFound",
    "Outcome",
    "RunNotFound",
    "Schedule",
    "Target",
    "Worker",
    "__version__",
    "client",
]
