"""The operator's surface over HTTP: the admin API and the Prometheus metrics.

Layering: :mod:`.metrics` depends on nothing of the daemon (it reads log records and a
snapshot callable); :mod:`.http` depends on :mod:`coordinator.client` for every SQL read
or write and on the daemon only through :class:`DaemonView`. The daemon does not import
this package; the command that runs the daemon wires it in::

    metrics = Metrics()
    log.observers.append(metrics.observe)
    view = view_of(daemon)
    metrics.gauges = view.status
    app = make_app(dsn=dsn, token=token, daemon=view, metrics=metrics,
                   audit=lambda rec: log.info("audit", **rec))
    await nursery.start(partial(serve_admin, app, "127.0.0.1:8787", shutdown=stopping))
"""

from .http import APP_ADMIN as APP_ADMIN
from .http import DaemonView as DaemonView
from .http import Status as Status
from .http import make_app as make_app
from .http import parse_listen as parse_listen
from .http import serve_admin as serve_admin
from .http import view_of as view_of
from .metrics import Metrics as Metrics

__all__ = [
    "APP_ADMIN",
    "DaemonView",
    "Metrics",
    "Status",
    "make_app",
    "parse_listen",
    "serve_admin",
    "view_of",
]
