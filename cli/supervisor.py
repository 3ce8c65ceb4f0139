"""The ``halluscope`` console command: the CLI runs in a child process, so a native crash is named, not silent.

llama.cpp (compiled code inside the process) can die from a signal: SIGSEGV on a CPU that advertises AMX in a
virtual machine that does not enable it, SIGILL on an instruction the CPU lacks. Python cannot catch that, and
the process used to end with nothing but the shell's "Segmentation fault". So :func:`main` forks: the child runs
:func:`halluscope.cli.main` (with :mod:`faulthandler` on, so a crash also prints the Python stack), the parent
waits and

* passes the child's exit status through; stdin, stdout and stderr are the child's own (inherited);
* when the child died from SIGSEGV, SIGILL, SIGBUS, SIGABRT or SIGFPE, prints one line naming the cause and the
  fix, and exits with 128 + the signal number (what a shell reports for such a death);
* when it died from another signal (SIGTERM, SIGINT, SIGKILL), dies from the same signal;
* forwards SIGINT, SIGTERM and SIGHUP sent to it by another process (``kill``, a process manager) to the child;
  the same signals from the terminal (Ctrl-C, a closed terminal) reach the child directly and are not sent twice.

Forking costs about a millisecond (no second interpreter start). Where there is no ``fork`` (Windows) the CLI runs
in this process as before. ``python -m halluscope`` is the CLI itself, without the supervisor.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable

__all__ = ["CRASH_SIGNALS", "crash_message", "main", "supervise"]

#: the signals that mean compiled code crashed (and not that someone stopped the command)
CRASH_SIGNALS = frozenset(getattr(signal, n) for n in ("SIGSEGV", "SIGILL", "SIGBUS", "SIGABRT", "SIGFPE")
                          if hasattr(signal, n))
_FORWARDED = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


def crash_message(signum: int, prog: str = "halluscope") -> str:
    """The one line shown when the command died from ``signum``."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = "an unknown signal"
    try:
        from halluscope.lm.llamacpp import probe_cache_path  # the standard library only

        cache = f", or delete {probe_cache_path()} to probe llama.cpp again"
    except Exception:  # noqa: BLE001 - the line must come out whatever else is broken
        cache = ""
    return (f"{prog}: the native runtime (llama.cpp) crashed with signal {signum} ({name}); run it again with "
            f"HALLUSCOPE_LLAMA_FAST=0 (llama.cpp's safe parameters){cache}; if it persists, report it with the "
            f"lines above")


def _child(target: Callable[[], int | None], old_mask) -> None:
    """In the forked child: the signal mask and handlers of a fresh process, faulthandler on, run ``target``."""
    code = 1
    try:
        if old_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        import faulthandler

        faulthandler.enable()
        try:
            code = target()
        except SystemExit as e:
            code = e.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - an uncaught exception: its traceback, status 1, as Python does
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:  # the child's own shutdown: flush, run its atexit handlers, then leave without returning
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
    sys.exit(code)


def _die_like(signum: int) -> None:
    """End this process with ``signum`` (its default action), so that our caller sees what the child got."""
    signal.signal(signum, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)


def _status(signum: int | None, code: int, prog: str) -> int:
    if signum is None:
        return code
    if signum in CRASH_SIGNALS:
        sys.stderr.write(crash_message(signum, prog) + "\n")
        sys.stderr.flush()
        return 128 + signum
    _die_like(signum)
    return 128 + signum  # only where the signal did not end us


def _decode(status: int) -> tuple[int | None, int]:
    if os.WIFSIGNALED(status):
        return os.WTERMSIG(status), 0
    return None, os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def supervise(target: Callable[[], int | None], prog: str = "halluscope") -> int:
    """Run ``target`` in a forked child and return the status this process should exit with (see the module
    docstring); without ``fork``, call it here."""
    if not hasattr(os, "fork"):
        return target() or 0
    waitinfo = hasattr(signal, "sigwaitinfo") and hasattr(signal, "pthread_sigmask")
    old_mask = None
    if waitinfo:  # the parent takes its signals synchronously: no handler can run between fork and wait
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {*_FORWARDED, signal.SIGCHLD})
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(target, old_mask)  # never returns
    if waitinfo:
        while True:
            info = signal.sigwaitinfo({*_FORWARDED, signal.SIGCHLD})
            if info.si_signo == signal.SIGCHLD:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done == pid:
                    return _status(*_decode(status), prog)
            elif info.si_code <= 0:  # sent by a process (kill, a supervisor): pass it on
                try:
                    os.kill(pid, info.si_signo)
                except ProcessLookupError:
                    pass
            # si_code > 0: sent by the kernel (the terminal's Ctrl-C or hang-up) to the whole foreground group,
            # the child included: nothing to forward
    # no sigwaitinfo (macOS): handlers forward what arrives; Ctrl-C reaches the child from the terminal itself
    for signum in _FORWARDED:
        if signum == signal.SIGINT:
            signal.signal(signum, signal.SIG_IGN)
        else:
            signal.signal(signum, lambda s, _f: os.kill(pid, s))
    while True:
        try:
            done, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return 1
        if done == pid:
            return _status(*_decode(status), prog)


def _run_cli() -> int:
    from halluscope.cli import main as cli_main

    return cli_main()


def main() -> int:
    """The ``halluscope`` console script."""
    return supervise(_run_cli)


if __name__ == "__main__":
    sys.exit(main())
