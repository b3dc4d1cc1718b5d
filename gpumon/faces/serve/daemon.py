"""The daemon's state: the session's ticks in, the log's lines and the exporter's view out.

One ``ServeState`` lives for the daemon's lifetime.  The sampling loop calls ``step()``:
the session reads NVML, the host and /proc (job labels of new pids, each job's process
tree) outside the lock, then folds the tick in under it (the detector, the job table,
the run's memory), then the log lines are written after it.  The Prometheus collector
reads under the same lock, so every scrape sees one tick's consistent state and never
waits on NVML, /proc or the disk.

The judging, the jobs and the run's memory are the engine's (``gpumon.engine``); what
lives here is the daemon's own: the lock, its health counters and its log lines.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpumon import __version__
from gpumon.engine import DetectorConfig, JobOptions, Reading, Session, StackOptions, Tick
from gpumon.engine.jobs import Job, JobKey, job_name
from gpumon.engine.memory import GpuEvent, GpuEventKind, GpuMemory, RunMemory
from gpumon.engine.summary_json import episode_core, run_core
from gpumon.engine.words import seconds_by_state
from gpumon.faces.serve.config import ServeConfig
from gpumon.faces.serve.log import EventLog
from gpumon.model import Episode, HostSample, JobLabels


def detector_config(cfg: ServeConfig) -> DetectorConfig:
    """The detector's thresholds the daemon's configuration sets (the rest as shipped)."""
    return DetectorConfig(hang_after_s=cfg.hang_after_s)


def stack_options(cfg: ServeConfig) -> StackOptions | None:
    """Whether and how the daemon reads the jobs' Python stacks (``[stacks]``)."""
    return StackOptions(every_s=cfg.stacks_every_s) if cfg.stacks_enabled else None


def reads_hardware(cfg: ServeConfig) -> bool:
    """Whether NVML's hardware readings are taken: the hardware group is their only user."""
    return "hardware" in cfg.collectors


def job_options(cfg: ServeConfig) -> JobOptions:
    """How the daemon's session follows jobs, from its configuration."""
    return JobOptions(
        sources=cfg.job_sources,
        max_jobs=cfg.max_jobs,
        linger_s=cfg.job_linger_s,
        process_trees=cfg.process_trees,
    )


class ServeState:
    """Everything `gpumon serve` knows; mutated by the sampling thread under ``lock``."""

    def __init__(
        self,
        session: Session,
        cfg: ServeConfig,
        log: EventLog,
        *,
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
    ) -> None:
        assert session.judging, "the daemon's session must judge"
        self.session = session
        self.cfg = cfg
        self.log = log
        self.memory: RunMemory = session.memory
        self.host: HostSample | None = None
        self.lock = threading.Lock()
        self._wall = wall
        self._mono = mono
        self.started_wall_s = wall()
        self._wall_minus_mono = self.started_wall_s - mono()
        self.driver_version = session.driver_version
        self.version = __version__
        self.ticks_total = 0
        self.tick_errors_total = 0
        self.last_sample_wall_s: float | None = None
        self.last_sample_duration_s: float | None = None
        self.nvml_errors: dict[str, int] = {}
        self.scrape_errors_total = 0
        self._last_summary_mono = mono()
        self._tick_error_kinds: set[str] = set()

    # --- what the exporter and the pages read (under ``lock``) ----------------------------

    @property
    def gpus(self) -> dict[int, GpuMemory]:
        return self.memory.gpus

    @property
    def jobs(self) -> dict[JobKey, Job]:
        tracker = self.session.jobs
        return {} if tracker is None else tracker.jobs

    @property
    def jobs_dropped_total(self) -> int:
        tracker = self.session.jobs
        return 0 if tracker is None else tracker.dropped_total

    def jobs_of(self, gpu: int) -> tuple[JobLabels, ...]:
        """The jobs holding ``gpu`` as last read."""
        tracker = self.session.jobs
        held = None if tracker is None else tracker.gpus.get(gpu)
        return () if held is None else held.jobs

    def job_episode(self, job: Job) -> Episode | None:
        """The job's open episode: its own detector's, or the node's for a whole-node job."""
        node = self.memory.open.get(None)
        tracker = self.session.jobs
        return node if tracker is None else tracker.episode_of(job, node)

    # --- time ------------------------------------------------------------------------------

    def wall_of(self, t_mono: float | None) -> float | None:
        return None if t_mono is None else t_mono + self._wall_minus_mono

    # --- the loop's body -------------------------------------------------------------------

    def step(self) -> None:
        """One tick: read, fold it in (lock), write the log.  Never raises."""
        try:
            reading = self.session.read()  # NVML, the host, /proc: outside the lock
        except Exception as exc:  # a bug or an unforeseen driver/proc fault: skip the tick
            self._tick_failed("sampling", exc)
            return
        try:
            self.ingest(reading)
        except Exception as exc:
            self._tick_failed("processing", exc)

    def _tick_failed(self, where: str, exc: BaseException) -> None:
        self.tick_errors_total += 1
        kind = f"{where}:{type(exc).__name__}"
        if kind not in self._tick_error_kinds and len(self._tick_error_kinds) < 32:
            self._tick_error_kinds.add(kind)
            print(
                f"gpumon: a tick failed while {where} ({type(exc).__name__}: {exc}); "
                "skipped, sampling goes on (counted in gpumon_sample_errors_total).",
                file=sys.stderr,
                flush=True,
            )

    def ingest(self, reading: Reading) -> Tick:
        """Fold one tick's reads in under ``lock`` (which the caller must not hold), then
        write its log lines once the lock is released."""
        with self.lock:
            tick = self.session.fold(reading)
            records = self._records(tick)
        for record in records:
            self.log.write(record)
        return tick

    def _records(self, tick: Tick) -> list[dict[str, Any]]:
        """The state's part of a tick (under ``lock``): counters and the log lines."""
        snap = tick.snapshot
        self.host = snap.host
        self.ticks_total += 1
        self.last_sample_wall_s = self.wall_of(snap.t_s)
        self.last_sample_duration_s = tick.sample_duration_s
        self.nvml_errors = self.session.nvml_errors
        records: list[dict[str, Any]] = []
        if self.log.path is not None:
            records += [self._gpu_record(ev) for ev in tick.events]
            if tick.update is not None:
                records += self._log_records(tick.update.closed, tick.update.opened, None)
            for labels, upd in tick.job_updates:
                records += self._log_records(upd.closed, upd.opened, labels)
        now = self._mono()
        if now - self._last_summary_mono >= self.cfg.summary_interval_s:
            self._last_summary_mono = now
            records.append(self.summary("summary"))
        return records

    def _gpu_record(self, ev: GpuEvent) -> dict[str, Any]:
        """The log line of a GPU appearing, lost or back."""
        record: dict[str, Any] = {
            "time": self.wall_of(ev.t_s),
            "event": str(ev.kind),
            "gpu": ev.identity.index,
            "uuid": ev.identity.uuid,
            "name": ev.identity.name,
        }
        if ev.kind is GpuEventKind.RECOVERED and ev.lost_since_s is not None:
            record["lost_since"] = self.wall_of(ev.lost_since_s)
            record["lost_s"] = round(ev.t_s - ev.lost_since_s, 3)
        if ev.kind is GpuEventKind.XID:
            del record["name"]
            record["xid"] = ev.xid
        return record

    # --- the log -------------------------------------------------------------------------------

    def _log_records(
        self, closed: tuple[Episode, ...], opened: tuple[Episode, ...], job: JobLabels | None
    ) -> list[dict[str, Any]]:
        """The log lines of an update, built under the lock, written after it."""
        if self.log.path is None:
            return []
        return [self._episode_record("episode_end", ep, job) for ep in closed] + [
            self._episode_record("episode_start", ep, job) for ep in opened
        ]

    def _episode_record(self, event: str, ep: Episode, job: JobLabels | None) -> dict[str, Any]:
        if job is not None:
            jobs: tuple[JobLabels, ...] = (job,)
        elif ep.gpu is not None:
            jobs = self.jobs_of(ep.gpu)
        else:
            jobs = ()
        at = ep.end_s if event == "episode_end" else ep.start_s
        return {
            "time": self.wall_of(at),
            "event": event,
            "scope": "job" if job is not None else ("gpu" if ep.gpu is not None else "node"),
            "gpu": ep.gpu,
            "uuid": ep.uuid,
            "job": job_name(jobs[0]) if len(jobs) == 1 else None,
            "jobs": [lb.as_dict() for lb in jobs],
            **episode_core(ep, self.wall_of(ep.start_s), self.wall_of(ep.end_s)),
            "duration_s": None if ep.duration_s is None else round(ep.duration_s, 3),
        }

    def summary(self, event: str = "summary") -> dict[str, Any]:
        """A periodic (and final) line: the node's run summary as every face writes it
        (``gpumon.engine.summary_json``), each GPU's state now, jobs and health."""
        verdict = self.session.verdict()
        run = self.session.summary()
        assert verdict is not None and run is not None
        core = run_core(run, {v.gpu: v.uuid for v in verdict.gpus})
        gpus = []
        for gcore, v in zip(core.pop("gpus"), verdict.gpus, strict=True):
            mem = self.gpus.get(v.gpu)
            line: dict[str, Any] = {
                **gcore,
                # The seconds its gpumon_gpu_state_seconds_total counters show.
                "seconds": seconds_by_state(self.memory.reported_seconds(v.gpu)),
                "state": str(v.state),  # now; the key before the schema, kept for its readers
                "state_now": str(v.state),
                "cause_now": None if v.cause is None else str(v.cause),
                "jobs": [lb.as_dict() for lb in self.jobs_of(v.gpu)],
                "lost": bool(mem is not None and mem.lost),
            }
            last = self.last_sample_wall_s
            since = None if mem is None else self.wall_of(mem.lost_since_s)
            if last is not None and since is not None:
                line["lost_for_s"] = round(last - since, 1)
            gpus.append(line)
        return {
            "time": self._wall(),
            "event": event,
            "version": self.version,
            "node_state": str(verdict.state),
            "node_cause": None if verdict.cause is None else str(verdict.cause),
            # The node's run so far, as `gpumon analyze` and the watch summary say it.
            **core,
            "straggler": run.straggler,
            "gpus": gpus,
            "jobs": [dict(j.labels.as_dict(), gpus=sorted(j.gpus)) for j in self.jobs.values()],
            "ticks": self.ticks_total,
            "nvml_errors": dict(self.nvml_errors),
            "log_write_errors": self.log.errors_total,
            "log_reopens": dict(self.log.reopens),
        }

    def finish(self, reason: str) -> None:
        """Close every open episode and write the final line (SIGTERM, end of run)."""
        with self.lock:
            record = self.summary("stop")  # the states as they were, before closing them
            closed = self.session.finish().closed
            records = self._log_records(closed, (), None)
            for labels, upd in self.session.finish_jobs():
                records += self._log_records(upd.closed, upd.opened, labels)
            record["stop_reason"] = reason
        self.session.close()
        for line in [*records, record]:
            self.log.write(line)
