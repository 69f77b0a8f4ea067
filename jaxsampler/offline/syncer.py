"""Group commit's fsyncs off the committing threads: :class:`BackgroundSync`.

Under a :class:`~jaxsampler.offline.GroupCommit` policy an acknowledgement waits for its
entries to reach the OS, not the disk: the fsync that makes a window of them survive a
machine crash is due now and then. Run in the committing thread it would stall whoever
committed (a sampler delivering answers, say) for the fsync's few milliseconds, and every
caller queued behind it; :class:`BackgroundSync` runs it on a thread of its own instead,
so a commit only asks for it. A failed fsync is kept in ``error`` for the owner to raise.
"""

from __future__ import annotations

import os
import threading

__all__ = ["BackgroundSync"]


class BackgroundSync:
    """fsyncs a file descriptor on a daemon thread when asked (:meth:`request`); several
    requests while one fsync runs make one more fsync after it, which covers them all.

    Attributes: ``syncs``, fsyncs finished; ``error``, the ``OSError`` of a failed fsync
    (then no more are run), or ``None``.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str):
        self.name = name
        self.syncs = 0
        self.error: OSError | None = None
        self._cond = threading.Condition(threading.Lock())
        self._fd: int | None = None  # the descriptor of the wanted fsync (None: none wanted)
        self._busy = False
        self._stop = False
        self._thread: threading.Thread | None = None

    def request(self, fd: int) -> None:
        """Asks for an fsync of ``fd`` that starts after this call (returns at once)."""
        with self._cond:
            if self._stop or self.error is not None:
                return
            self._fd = fd
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def quiesce(self) -> None:
        """Drops a wanted fsync and waits for a running one to end: after it, no fsync
        touches the descriptor until the next :meth:`request` (call it before closing the
        descriptor, under whatever lock orders the requests)."""
        with self._cond:
            self._fd = None
            while self._busy:
                self._cond.wait()

    def stop(self) -> None:
        """Quiesces and ends the thread (idempotent)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self.quiesce()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._fd is None and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                fd = self._fd
                assert fd is not None
                self._fd, self._busy = None, True
            error = None
            try:
                os.fsync(fd)
            except OSError as e:
                error = e
            with self._cond:
                self._busy = False
                if error is not None:
                    self.error, self._stop = error, True
                else:
                    self.syncs += 1
                self._cond.notify_all()
