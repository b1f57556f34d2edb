"""Multi-process runs that cannot hang silently.

* :func:`local_log_dir`: the run directory without ``Trainer.log_dir``'s broadcast (a collective:
  read on rank 0 alone it met another rank's all-reduce and both waited forever).
* :func:`warn_if_oversubscribed`: more CPU processes than cores, said in one line before work starts.
* :func:`set_collective_timeout`: how long a collective waits for a rank (``--distributed_timeout``).
* :class:`RankWatch`: under DDP, a rank that dies, hangs or gets SIGTERM ends every rank, and the
  output names the rank. ``lightning-grpo fit`` attaches it (with ``handle_signals=True``); in your
  own script add ``RankWatch()`` to the Trainer's callbacks if you want it.

What RankWatch does, per rank (a thread that polls every second, so it works while the main
thread waits inside a collective):

* the launcher (rank 0, which started the other ranks): when a rank process exits before training
  ends, print ``lightning-grpo: rank R (pid P) exited with status S``; give the run ``grace``
  seconds to fail on its own (its next collective reports the lost peer), then kill what is left.
* every other rank: when the launcher is gone, print it and exit (nothing waits for a dead peer).
* a collective that times out: the rank that saw it records it in the rendezvous store, waits
  ``grace`` seconds for the others to record theirs, and names each rank that did not as
  ``lightning-grpo: rank R stopped answering``; the launcher then kills the ranks still running.
* SIGTERM (and SIGINT), only with ``handle_signals=True``: forwarded by the launcher to the other
  ranks at once (through a wake-up pipe, so also while the main thread is blocked), the run stops
  with an error (status 143), and a rank still running ``grace`` seconds later is killed. Lightning's
  own SIGTERM handler broadcasts inside the handler, which can meet a pending all-reduce and hang
  both ranks. Without it your signal handlers are left as they are; with it the previous SIGTERM
  handler and wake-up fd are restored when the fit ends.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from lightning.pytorch.callbacks import Callback

log = logging.getLogger("lightning_grpo.callbacks.distributed")

DEFAULT_TIMEOUT_S = 600.0
_KEY = "lightning_grpo/timed_out/"


def local_log_dir(trainer: Any) -> str | None:
    """What ``trainer.log_dir`` returns, read from this process alone (no broadcast). On rank 0 it
    is the run directory; other ranks may see another version number, so only rank-0 writers use it."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    if not trainer.loggers:
        return trainer.default_root_dir
    logger = trainer.loggers[0]
    return logger.log_dir if isinstance(logger, (TensorBoardLogger, CSVLogger)) else logger.save_dir


def available_cpus() -> int:
    """The cores this process may run on (its affinity mask; ``os.cpu_count`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def warn_if_oversubscribed(trainer: Any) -> bool:
    """One warning line (rank 0) when a CPU run starts more processes than this machine gives it cores."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only
    from lightning.pytorch.accelerators import CPUAccelerator

    devices, cores = trainer.num_devices, available_cpus()
    if not isinstance(trainer.accelerator, CPUAccelerator) or devices <= cores:
        return False
    if getattr(rank_zero_only, "rank", 0) == 0:  # Lightning's strategy / rank_zero_only (third-party)
        log.warning(
            f"lightning-grpo: trainer.devices={devices} starts {devices} CPU processes on {cores} available core(s): "
            f"they share cores (slower, and collectives may time out); use --trainer.devices {cores} or fewer"
        )
    return True


def set_collective_timeout(trainer: Any, seconds: float) -> None:
    """How long a collective (all-reduce, broadcast, barrier) waits for every rank before it fails,
    for DDP / FSDP strategies (their ``timeout``); set before ``fit`` creates the process group."""
    if not seconds or seconds <= 0:
        raise ValueError(f"distributed_timeout must be > 0 seconds, got {seconds!r}")
    if hasattr(trainer.strategy, "_timeout"):  # Lightning's strategy / rank_zero_only (third-party)
        trainer.strategy._timeout = timedelta(seconds=float(seconds))


def collective_timeout(trainer: Any) -> float | None:
    timeout = getattr(trainer.strategy, "_timeout", None)  # Lightning's strategy / rank_zero_only (third-party)
    return timeout.total_seconds() if timeout is not None else None


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    log.debug(message)


def _default_store() -> Any:
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:  # noqa: BLE001 - no store: no diagnosis, the run still ends
        return None


def _is_timeout(err: BaseException) -> bool:
    text = str(err).lower()
    return "timed out" in text or "timeout" in text


class RankWatch(Callback):
    """Ends every rank of a multi-process fit when one dies, hangs or gets SIGTERM, naming it (see
    the module docstring). ``grace``: seconds the run gets to stop by itself before what is left is
    killed; ``poll``: how often the rank processes are checked; ``handle_signals``: replace the SIGTERM
    handler and set a signal wake-up fd for the fit, so that SIGTERM / SIGINT stop every rank (off: your
    handlers are left alone)."""

    def __init__(self, grace: float = 5.0, poll: float = 1.0, handle_signals: bool = False) -> None:
        self.grace, self.poll, self.handle_signals = grace, poll, handle_signals
        self._previous_sigterm: Any = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._procs: dict[int, Any] = {}  # global rank -> Popen of the ranks this process launched
        self._reported: set[int] = set()
        self._parent: int | None = None  # the launcher's pid (ranks it started)
        self._deadline: float | None = None  # monotonic time after which this rank is ended
        self._exit_status: int | None = None
        self._pipe: tuple[int, int] | None = None
        self._fit_trainer: Any = None

    # ---------------------------------------------------------------------------- lifecycle
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.world_size < 2:
            return
        self._fit_trainer, self._rank = trainer, trainer.global_rank
        procs = list(getattr(trainer.strategy.launcher, "procs", None) or [])  # Lightning's subprocess launcher
        first = trainer.node_rank * trainer.num_devices + 1
        self._procs = {first + i: proc for i, proc in enumerate(procs)}
        self._parent = os.getppid() if trainer.local_rank > 0 and os.getppid() != 1 else None
        self._store, self._done = _default_store(), threading.Event()
        if self.handle_signals:
            self._install_signal_handling()
        threading.Thread(target=self._watch, name="lightning-grpo-rank-watch", daemon=True).start()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stop()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._stop()

    def _stop(self) -> None:
        self._done.set()
        if threading.current_thread() is not threading.main_thread():
            return
        if self._pipe is not None:
            signal.set_wakeup_fd(-1)
            os.close(self._pipe[1])  # the reader sees the end of the pipe and closes its side
            self._pipe = None
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    # ---------------------------------------------------------------------------- failures
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """This rank's fit failed: name the rank that stopped answering (a collective timeout) or
        exited, end the ranks this process launched, and make sure this one ends too."""
        if self._fit_trainer is None or self._done.is_set():
            return
        silent = self._silent_ranks(trainer) if _is_timeout(exception) else []
        for rank in silent:  # named already; no second report of the kill
            proc = self._procs.get(rank)
            if proc is not None and proc.poll() is None:
                self._reported.add(rank)
                proc.kill()
        deadline = time.monotonic() + self.grace  # the others end by themselves (their peer is gone) ...
        while any(p.poll() is None for p in self._procs.values()) and time.monotonic() < deadline:
            self._check_ranks()
            time.sleep(0.1)
        self._check_ranks()
        for rank, proc in self._procs.items():  # ... or are killed
            if proc.poll() is None:
                _say(
                    f"lightning-grpo: rank {rank} (pid {proc.pid}) still runs {self.grace:g} s after the run failed: killed"
                )
                self._reported.add(rank)
                proc.kill()
        self._arm()

    def _silent_ranks(self, trainer: Any) -> list[int]:
        """After a collective timed out here: record it in the rendezvous store, wait ``grace`` s
        for the other ranks to record theirs; the ranks that did not are named (and returned)."""
        timeout, step = collective_timeout(trainer), trainer.global_step
        waited = f"waited {timeout:g} s" if timeout else "timed out"
        others = [r for r in range(trainer.world_size) if r != self._rank]
        try:
            self._store.set(f"{_KEY}{self._rank}", str(step))
            deadline, silent = time.monotonic() + self.grace, others
            while silent and time.monotonic() < deadline:
                silent = [r for r in silent if not self._store.check([f"{_KEY}{r}"])]
                time.sleep(0.2)
        except Exception:  # noqa: BLE001 - the store lives in rank 0's process
            silent = [0] if self._rank != 0 else others
        for rank in silent:
            _say(
                f"lightning-grpo: rank {rank} stopped answering: a collective of rank {self._rank} at step {step} {waited} "
                "for it (--distributed_timeout); stopping the run"
            )
        if not silent:
            _say(
                f"lightning-grpo: every rank timed out in a collective at step {step}: the ranks called different "
                "collectives (one reached by some ranks only, e.g. under `if trainer.is_global_zero`)"
            )
        return silent

    def _check_ranks(self) -> None:
        """Report each launched rank that exited (status 0 only while training still runs ``grace`` s later)."""
        with self._lock:
            for rank, proc in self._procs.items():
                status = proc.poll()
                if status is None or rank in self._reported or self._exit_status is not None:  # (a signal stops them)
                    continue
                if status == 0 and not self._exited_long_ago(proc):
                    continue
                self._reported.add(rank)
                _say(
                    f"lightning-grpo: rank {rank} (pid {proc.pid}) exited with status {status} at step "
                    f"{self._fit_trainer.global_step}; stopping the run"
                )
                self._arm()
            if self._parent is not None and os.getppid() != self._parent:
                _say(f"lightning-grpo: rank {self._rank}: the launcher (rank 0, pid {self._parent}) is gone; stopping")
                self._parent = None
                self._arm(0.0)

    def _exited_long_ago(self, proc: Any) -> bool:
        # a subprocess.Popen (standard library): the mark is set below
        seen = getattr(proc, "_lightning_grpo_exit_seen", None)
        if seen is None:
            proc._lightning_grpo_exit_seen = seen = time.monotonic()
        return time.monotonic() - seen > self.grace

    def _arm(self, delay: float | None = None) -> None:
        """End this rank ``delay`` (default ``grace``) seconds from now unless it ended by then."""
        if self._deadline is None:
            self._deadline = time.monotonic() + (self.grace if delay is None else delay)

    def _watch(self) -> None:
        while not self._done.wait(self.poll):
            self._check_ranks()
            if self._deadline is not None and time.monotonic() >= self._deadline and not self._done.is_set():
                self._end_now()

    def _end_now(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
        _say(f"lightning-grpo: rank {self._rank} did not stop within {self.grace:g} s: ending it")
        os._exit(self._exit_status or 1)

    # ---------------------------------------------------------------------------- signals
    def _install_signal_handling(self) -> None:
        """SIGTERM ends the fit with status 143 (Lightning's handler, replaced here, broadcasts inside
        the handler); a wake-up pipe lets a thread act on SIGTERM / SIGINT while the main thread is
        blocked in a collective: forward SIGTERM to the launched ranks, end this one after ``grace``."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_signal)
        read, write = os.pipe()
        os.set_blocking(write, False)
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        if previous != -1:  # someone else's (an event loop): keep it
            signal.set_wakeup_fd(previous)
            os.close(read), os.close(write)
            return
        self._pipe = (read, write)
        threading.Thread(target=self._read_signals, args=(read,), name="lightning-grpo-signals", daemon=True).start()

    def _read_signals(self, fd: int) -> None:
        while True:
            data = os.read(fd, 64)
            if not data:
                os.close(fd)
                return
            for signum in data:
                if signum in (signal.SIGTERM, signal.SIGINT) and not self._done.is_set():
                    if self._exit_status is None:
                        self._exit_status = 128 + signum
                        _say(
                            f"lightning-grpo: rank {self._rank} got {signal.Signals(signum).name}: stopping every rank"
                        )
                    for proc in self._procs.values():
                        if proc.poll() is None:
                            proc.send_signal(signal.SIGTERM)
                    self._arm()


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)
