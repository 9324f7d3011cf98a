"""A benchmark stopped with SIGTERM unwinds, so running_service removes what the run made."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from bench.commands import exit_on_sigterm


def test_sigterm_raises_system_exit_so_finally_blocks_run() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    cleaned = []
    try:
        exit_on_sigterm()
        with pytest.raises(SystemExit) as stopped:
            try:
                os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next statement
            finally:
                cleaned.append(True)
        assert stopped.value.code == 128 + signal.SIGTERM and cleaned == [True]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_outside_the_main_thread_it_leaves_the_handler_alone() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            exit_on_sigterm()
        except BaseException as error:  # noqa: BLE001 - the test reports any failure
            errors.append(error)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert errors == [] and signal.getsignal(signal.SIGTERM) is previous
