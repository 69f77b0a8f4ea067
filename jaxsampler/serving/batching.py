"""``/batch`` requests: run a slice of commands at a time, fairly across connections.

A ``/batch`` body holds many commands (how local-inference clients ship experience). A
small one (up to 8 KiB, 32 commands) runs at once on the event loop like a single command:
no thread hand-over, which costs GIL switches when the process is busy. A bigger one runs
on a two-thread pool in slices of 32 commands, round-robin across connections, so a caller
shipping huge batches delays others by about one slice each. A batch whose command must
wait for room (the env's back pressure) waits on the blocking pool, not on the batch pool.
A batch whose connection closed before its first slice ran is dropped (nobody would get its
answer); once started, it runs to the end (half a batch would be worse).

What the commands mean is the policy server's business
(:class:`~jaxsampler.serving.server.PolicyServer`): it hands :class:`FairBatches` a function
that decodes a body into its commands and one that runs a command.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jaxsampler.episodes.codec import packb
from jaxsampler.host_envs import external as ext
from jaxsampler.serving.http import Connection, status_of

__all__ = ["BatchJob", "FairBatches"]

_BATCH_WORKERS = 2  # threads running /batch slices (pure Python under the GIL: few suffice)
_BATCH_SLICE = 32  # commands run per slice before other connections' batches get a turn
_INLINE_BATCH_BYTES = 8 << 10  # /batch bodies up to this size start on the event loop

#: ``(body, owner) -> commands``: decodes a ``/batch`` body (running what it carries besides,
#: such as deferred ``log_returns``); raises to fail the whole request.
CommandsOf = Callable[[bytes, Any], list]
#: ``(index, command, owner, block) -> None``: runs one command; raises to refuse it (the
#: others still run), or :class:`~jaxsampler.host_envs.external.WouldBlockError` when it must
#: wait for room and ``block`` is false.
RunCommand = Callable[[int, Any, Any, bool], None]
#: ``(answer body or None) -> None``: told how a batch ended (its 200 body; ``None`` when
#: it failed as a whole or was dropped); how the server records a batch's request id.
Record = Callable[[bytes | None], None]


class BatchJob:
    """One ``/batch`` request: decoded, then run :data:`_BATCH_SLICE` commands at a time by
    :class:`FairBatches`, so big batches of one connection interleave with everybody else's."""

    __slots__ = (
        "batches",
        "conn",
        "body",
        "owner",
        "commands",
        "next",
        "errors",
        "result",
        "record",
    )

    def __init__(
        self,
        batches: FairBatches,
        conn: Connection,
        body: bytes,
        owner: Any,
        record: Record | None = None,
    ):
        self.batches, self.conn, self.body, self.owner = batches, conn, body, owner
        self.record = record
        self.commands: list | None = None
        self.next = 0
        self.errors: list[dict] = []
        self.result: Any = None  # the answer: a dict, or the exception that fails the request

    def step(self) -> bool:
        """Runs the next slice (the first one decodes first); returns whether the job is
        finished.
        Raises :class:`~jaxsampler.host_envs.external.WouldBlockError` when a command must
        wait for room (back pressure): the rest then runs with :meth:`run_blocking`."""
        if self.commands is None:
            if self.conn.closing:  # the client is gone before it ran: nobody gets the answer
                self.result = None
                return True
            try:
                commands = self.batches.commands_of(self.body, self.owner)
            except Exception as e:
                self.result = e
                return True
            self.body = b""
            self.commands = commands
        end = min(len(self.commands), self.next + _BATCH_SLICE)
        while self.next < end:
            self._run_one(block=False)
        return self.next >= len(self.commands) and self._finish()

    def run_blocking(self) -> None:
        """The rest of the batch, waiting for room where needed (a worker of the blocking pool)."""
        assert self.commands is not None
        try:
            while self.next < len(self.commands):
                self._run_one(block=True)
            self._finish()
        except Exception as e:  # pragma: no cover - _run_one records command errors itself
            self.result = e
        self.answer()

    def _run_one(self, block: bool) -> None:
        assert self.commands is not None
        i = self.next
        try:
            self.batches.run_command(i, self.commands[i], self.owner, block)
        except ext.WouldBlockError:
            raise  # not this command's error: it runs again, blocking
        except Exception as e:  # a refused command does not stop the others
            status, name = status_of(e)
            self.errors.append({"index": i, "status": status, "error": name, "message": str(e)})
        self.next += 1

    def _finish(self) -> bool:
        assert self.commands is not None
        self.result = {"done": len(self.commands) - len(self.errors), "errors": self.errors}
        return True

    def answer(self) -> None:
        """Sends the result from the event-loop thread (callable from any thread)."""
        self.conn.done_threadsafe(self.respond)

    def respond(self) -> None:
        """Sends the result (event-loop thread)."""
        conn, result, record = self.conn, self.result, self.record or _ignore
        if result is None:  # dropped (see step)
            record(None)
            return
        if isinstance(result, BaseException):
            record(None)
            conn.exception(result)
        else:
            try:
                data = packb(result)
            except Exception as e:
                record(None)
                conn.exception(e)
            else:
                record(data)  # before the answer: a retry that follows it finds it
                conn.respond(200, data)


class FairBatches:
    """Runs :class:`BatchJob` slices on a few threads, round-robin over the jobs (each
    connection has at most one), so a connection flooding big batches delays another one's
    small batch by about one slice per busy connection instead of whole batches.

    Args:
        blocking: the pool where a job waits for room (back pressure).
        commands_of / run_command: what a body's commands are and how one runs (see
            :data:`CommandsOf` and :data:`RunCommand`).
    """

    def __init__(
        self, blocking: ThreadPoolExecutor, commands_of: CommandsOf, run_command: RunCommand
    ):
        self.commands_of, self.run_command = commands_of, run_command
        self._pool = ThreadPoolExecutor(_BATCH_WORKERS, thread_name_prefix="PolicyServer-batch")
        self._blocking = blocking
        self._ready: deque[BatchJob] = deque()
        self._lock = threading.Lock()

    def start(
        self, conn: Connection, body: bytes, owner: Any, record: Record | None = None
    ) -> None:
        """Serves a ``/batch`` request (event-loop thread). A small one (one slice) runs here
        at once, like a single command; bigger ones go to the batch pool, a slice at a time;
        one that must wait for room to the blocking pool. ``record``: told how it ended."""
        job = BatchJob(self, conn, body, owner, record)
        if len(body) <= _INLINE_BATCH_BYTES:
            try:
                finished = job.step()
            except ext.WouldBlockError:
                conn.busy = True
                self._blocking.submit(job.run_blocking)
                return
            if finished:
                job.respond()
                return
        conn.busy = True
        self.submit(job)

    def submit(self, job: BatchJob) -> None:
        """Queues a job for its next slice (any thread)."""
        with self._lock:
            self._ready.append(job)
        self._pool.submit(self._run_slice)  # one task per queued job: it runs whichever is first

    def _run_slice(self) -> None:
        with self._lock:
            job = self._ready.popleft()
        while True:
            try:
                finished = job.step()
            except ext.WouldBlockError:  # back pressure: wait for room off this pool
                self._blocking.submit(job.run_blocking)
                return
            except Exception as e:  # pragma: no cover - step() records command errors itself
                job.result, finished = e, True
            if finished:
                job.answer()
                return
            with self._lock:
                if not self._ready:
                    continue  # nobody else waits: no hand-over to another thread
            self.submit(job)  # to the back: the other connections' jobs go first
            return

    def shutdown(self) -> None:
        """Stops the batch pool (queued slices are dropped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _ignore(data: bytes | None) -> None:
    """The :data:`Record` of a batch without a request id."""
