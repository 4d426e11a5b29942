"""One engine process for one configuration, and the run context every stage shares.

The measurement, the max-streams ramp and the soak all hold an :class:`EngineSession`: start,
wait until ready, confirm the speculation asked for is active, read the capacity from the
start-up log, restart (the soak's watchdog), stop. The session knows when its process started,
so every soak window and verdict carries the engine's uptime (seed 000's "collapsed after six
hours" is an uptime, not a wall-clock time). The :class:`RunContext` is what the runner hands
the soak instead of itself, so the soak never imports the runner.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from engines.base import Engine
from engines.errors import EngineCrashed
from engines.types import Capacity, LaunchSpec
from harness.common.net import free_port
from harness.config.loader import LoadedScenario
from harness.config.schema import Configuration, Scenario, safe_name
from harness.load.client import RequestParams
from harness.probe.gpu import GpuMeter, process_tree
from harness.session.observers import Observers


def launch_spec(loaded: LoadedScenario, cfg: Configuration, port: int) -> LaunchSpec:
    """What a configuration asks of the engine, engine-neutral (the API key read from the environment)."""
    srv = loaded.scenario.server
    syn = cfg.synthetic
    return LaunchSpec(
        model=loaded.target_of(cfg),
        algorithm=cfg.algorithm,
        draft=loaded.model_path(cfg.draft) if cfg.draft else None,
        k=cfg.k,
        k_min=cfg.k_min,
        synthetic_length=syn.length if syn else None,
        synthetic_rates=tuple(syn.rates) if syn and syn.rates else None,
        ctx_size=srv.ctx_size,
        parallel=srv.parallel,
        threads=srv.threads,
        extra_args=tuple(srv.extra_args) + tuple(cfg.engine_args),
        binary=Path(srv.binary) if srv.binary else None,
        port=srv.port or port,
        host=srv.host,
        request_base_url=srv.request_base_url,
        api_key=os.environ.get(srv.api_key_env) if srv.api_key_env else None,
        env=tuple(sorted((k, str(v)) for k, v in srv.env.items())),
        attach_url=srv.url,
        metrics_url=srv.metrics_url,
        log_max_mib=loaded.scenario.report.engine_log_max_mib,
        attach_log=(Path(srv.log_file) if Path(srv.log_file).is_absolute() else loaded.path.parent / srv.log_file)
        if srv.log_file
        else None,
    )


@dataclass
class RunContext:
    """What every stage of a run needs: the scenario, the folder, the console, the observers, the engine class."""

    loaded: LoadedScenario
    run_dir: Path
    console: Console
    obs: Observers
    engine_cls: type[Engine]
    params: RequestParams
    gpu: GpuMeter = field(default_factory=GpuMeter)  # NVML, once per run (harness/probe/gpu.py): "n/a" without a driver

    def gpu_sample(self, pid: int | None) -> dict[str, Any]:
        """GPU memory now (devices, and the engine's process tree where the driver says): the ``gpu`` field of
        phase records and soak windows; ``available: false`` with the reason where there is no NVIDIA GPU."""
        return self.gpu.sample(process_tree(pid) if pid is not None else None).to_dict()

    @property
    def sc(self) -> Scenario:
        return self.loaded.scenario

    def session(self, cfg: Configuration, stage: str | None, port: int | None = None) -> EngineSession:
        """A session whose engine logs to ``logs/<config>[.<stage>].server.log``."""
        name = safe_name(cfg.name) + (f".{stage}" if stage else "")
        return EngineSession(self, cfg, self.run_dir / "logs" / f"{name}.server.log", port)


def _process_started(pid: int | None) -> float | None:
    if pid is None:
        return None
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


class EngineSession:
    """One configuration's engine: ``start`` (ready, speculation checked), ``restart``, ``stop``, ``uptime_s``."""

    def __init__(self, ctx: RunContext, cfg: Configuration, log_path: Path, port: int | None = None):
        self.ctx = ctx
        self.cfg = cfg
        self.log_path = log_path
        self.port = port or free_port(
            ctx.sc.server.host
        )  # the same port across restarts: a scraper's target stays valid
        self.engine: Engine = ctx.engine_cls(launch_spec(ctx.loaded, cfg, self.port), log_path)
        self.started_unix: float | None = None
        self.starts = 0
        self.ready_s: float | None = None

    # ---- life ------------------------------------------------------------------------
    def start(self) -> float:
        """Start the engine and wait until it serves with the speculation asked for; seconds to ready.

        Raises an EngineError subclass (the engine is stopped first) when it cannot."""
        srv = self.ctx.sc.server
        self.engine.start()
        self.started_unix = time.time()
        if (
            self.attached
        ):  # its uptime is its process's age where the process is on this machine, else time since attaching
            self.started_unix = _process_started(self.engine.pid) or self.started_unix
        self.starts += 1
        self.ctx.obs.on_config_start(
            self.cfg.name,
            self.cfg.algorithm,
            self.cfg.is_synthetic,
            self.engine.name,
            self.engine.base_url,
            self.engine.pid,
        )
        try:
            self.ready_s = self.engine.wait_ready(srv.start_timeout_s)
            self.engine.check_speculation()
        except BaseException:
            self.engine.stop(0)
            raise
        return self.ready_s

    @property
    def attached(self) -> bool:
        """A server specsoak did not start (server.url): never restarted or stopped."""
        return self.engine.spec.attached

    def restart(self, kill: bool = False) -> float:
        """Stop what is left (SIGKILL at once when ``kill``: a hung engine) and start a new process on the same port."""
        if self.attached:
            raise EngineCrashed(f"the attached server at {self.engine.base_url} is not specsoak's to restart")
        self.stop(0 if kill else None)
        self.engine = self.ctx.engine_cls(self.engine.spec, self.log_path)
        return self.start()

    def stop(self, grace_s: float | None = None) -> int | None:
        return self.engine.stop(self.ctx.sc.server.stop_grace_s if grace_s is None else grace_s)

    # ---- state -----------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self.engine.pid

    def alive(self) -> bool:
        return self.engine.alive()

    def uptime_s(self, now: float | None = None) -> float | None:
        """Seconds since the current engine process started (None before the first start)."""
        if self.started_unix is None:
            return None
        return (time.time() if now is None else now) - self.started_unix

    def capacity(self) -> Capacity:
        return self.engine.capacity()

    def display_command(self) -> list[str]:
        return self.engine.display_command()

    def describe(self) -> dict[str, Any]:
        return {"pid": self.pid, "starts": self.starts, "started_unix": self.started_unix, "uptime_s": self.uptime_s()}
