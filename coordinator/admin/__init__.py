"""The operator's surface over HTTP: the admin API and the Prometheus metrics.

Layering: nothing here imports the daemon. The API reads the daemon's typed snapshot
(:class:`~coordinator.status.DaemonStatus`, through a callable) and sends every SQL read
or write through :mod:`coordinator.client`; the metrics are fed the daemon's typed
events (:mod:`coordinator.events`) and read the snapshot at scrape time. The command
that runs the daemon wires them in (:mod:`coordinator.service`)::

    metrics = Metrics(status=daemon.status)
    daemon.events.subscribe(metrics.observe)
    app = make_app(dsn=dsn, token=token, status=daemon.status, metrics=metrics,
                   audit=audit_to(log))
    await nursery.start(partial(serve_admin, app, "127.0.0.1:8787", shutdown=stopping))
"""

from .http import APP_ADMIN as APP_ADMIN
from .http import audit_to as audit_to
from .http import make_app as make_app
from .http import serve_admin as serve_admin
from .metrics import Metrics as Metrics

__all__ = ["APP_ADMIN", "Metrics", "audit_to", "make_app", "serve_admin"]
