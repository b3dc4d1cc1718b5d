"""One serve daemon, whole: its state, its metrics endpoint and its log, started and
stopped together.

`gpumon serve` runs one over a live session and `gpumon demo` one over its own replay
of the bundled trace: both build it here, so the demo's daemon is serve's, wired once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpumon.engine import Session
from gpumon.faces.serve.collector import make_registry
from gpumon.faces.serve.config import ServeConfig
from gpumon.faces.serve.daemon import ServeState
from gpumon.faces.serve.http import ConnectionStats, MetricsServer
from gpumon.faces.serve.landing import StatePages
from gpumon.faces.serve.log import EventLog


class Daemon:
    """A daemon over ``session``: bound to its port when built (a port in use fails here,
    in one sentence, before anything is logged), serving from ``start``."""

    def __init__(
        self,
        session: Session,
        cfg: ServeConfig,
        *,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        from prometheus_client import disable_created_metrics

        disable_created_metrics()
        self.cfg = cfg
        self.wall = wall
        # The log opens once the port is bound: a daemon that cannot serve writes nothing.
        self.state = ServeState(session, cfg, EventLog(None), wall=wall, mono=mono)
        self.stats = ConnectionStats()
        self.server = MetricsServer(
            cfg,
            make_registry(self.state, self.stats),
            pages=StatePages(self.state),
            stats=self.stats,
        )
        self.log = self.state.log = EventLog(cfg.log_path)

    @property
    def port(self) -> int:
        return self.server.port

    def start(self, **start_line: Any) -> None:
        """Serve, and log the start line (the daemon's summary, and ``start_line``)."""
        self.server.start()
        start = self.state.summary("start")
        start.update(start_line)
        self.log.write(start)

    def step(self) -> None:
        """One tick: the log reopened if asked (SIGHUP, logrotate), then sample and judge."""
        if self.log.reopen_wanted:
            self.log.reopen()
            self.log.write({"time": self.wall(), "event": "log_reopened"})
        self.state.step()

    def close(self, reason: str) -> None:
        """End the run's episodes with ``reason``, stop serving, close the log."""
        try:
            self.state.finish(reason)
        finally:
            self.server.close()
            self.log.close()
