"""A call that runs for at most N seconds: how a chat template's render is bounded (targets/chat.py).

    from dspark_cli.targets.deadline import Overtime, within
    text = within(5.0, lambda: tokenizer.apply_chat_template(messages, tokenize=False))  # or Overtime

A Jinja template compiles to Python, so it can be interrupted at its next bytecode: on the main thread
by a SIGALRM timer (a few microseconds per render), on any other thread (or when
SIGALRM is someone else's) by a timer thread that raises `Overtime` in the rendering thread
(`PyThreadState_SetAsyncExc`, about a thread start per render). Neither interrupts one long C call (a
huge string repeat): it stops right after it. Jinja's sandbox already refuses `range` over 100000; a
timeout is what stops loops nested within that bound (pallets/jinja#1691 leaves it to the caller).
"""

from __future__ import annotations

import ctypes
import signal
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Overtime(Exception):  # noqa: N818 - reads as what happened: the call ran overtime
    """The call ran past its deadline and was stopped. An Exception, so that Jinja rewrites the traceback
    onto the template's own lines (`template_line` reads the line it stopped at)."""


def within(seconds: float, call: Callable[[], T]) -> T:
    """`call()`, stopped with `Overtime` once it has run `seconds` (wall clock)."""
    if _alarm_is_free():
        return _with_alarm(seconds, call)
    return _with_timer_thread(seconds, call)


def template_line(exc: BaseException) -> int | None:
    """The template line an exception was raised at (Jinja maps its frames to `<template>` lines)."""
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line if line is not None else getattr(exc, "lineno", None)  # a syntax error carries its own


def _alarm_is_free() -> bool:
    """SIGALRM can stop this call: on the main thread, with no handler or timer of other code set."""
    return (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    )


def _on_alarm(signum: int, frame: object) -> None:
    raise Overtime


def _with_alarm(seconds: float, call: Callable[[], T]) -> T:
    # installed for this call only: nothing of ours stays in the process, and an alarm that fires as
    # the call returns finds the default handler again, which Python skips
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return call()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)


def _with_timer_thread(seconds: float, call: Callable[[], T]) -> T:
    target, lock, finished = threading.get_ident(), threading.Lock(), [False]

    def interrupt() -> None:
        with lock:  # never after the call has returned: `finished` is set under the same lock
            if not finished[0]:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), ctypes.py_object(Overtime))

    timer = threading.Timer(seconds, interrupt)
    timer.daemon = True
    timer.start()
    try:
        return call()
    finally:
        with lock:  # an Overtime set just before this lands here, still inside this call
            finished[0] = True
        timer.cancel()
