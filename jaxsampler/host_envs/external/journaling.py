"""The write-ahead side of external envs: the :class:`Journal` an env writes each change to
before making it, and :class:`_Journaled`, the env's plumbing for it (recording under the
lock, committing before an acknowledgement, deferred commits for a server's requests,
checkpoints, and closing the env when the journal fails). The journal itself is
:class:`~jaxsampler.offline.StepJournal`; recovery is :func:`~jaxsampler.offline.recover`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from jaxsampler.host_envs.external.episodes import _Episode
from jaxsampler.host_envs.external.errors import EnvClosedError

__all__ = ["Journal"]


class Journal(Protocol):
    """Where an external env writes each change before it takes effect (write-ahead; see
    :class:`~jaxsampler.offline.StepJournal`). :meth:`record` runs under the env's lock, in
    the order the changes happen, and may only buffer; :meth:`commit` makes every recorded
    entry durable and runs before a change is acknowledged (before a call returns, and
    before the answers of a ``send_actions`` wake their callers). When either raises, the
    env closes (the call and every later one raise :class:`EnvClosedError` naming the
    failure); a change whose :meth:`record` raised does not happen."""

    def record(self, entry: dict[str, Any]) -> None:
        """Takes one entry, in order (it may only buffer it)."""

    def commit(self) -> None:
        """Makes every entry recorded so far durable (thread-safe)."""

    def known(self, episode_id: str) -> bool:
        """Whether ``episode_id`` ran before this server run (a pre-restart id)."""

    # Optional: ``encode(entry) -> bytes`` with ``record(entry, payload)`` taking its bytes
    # (the env then encodes big entries before taking its lock).
    # Optional (a journal without them cannot take checkpoints; see ``checkpoint_journal``):
    # ``forget(episode_id)``, called under the lock when the env drops a finished episode,
    # and ``checkpoint(live_ids, log_offset)``, called under the lock by checkpoint_journal.


class _Journaled:
    """The journal plumbing of :class:`~jaxsampler.host_envs.external.ExternalEnvBase`
    (a mixin before its episode book, whose lock, table and closing it uses)."""

    journal: Journal | None
    _journal_error: BaseException | None
    _deferral: threading.local
    _lock: Any
    _closed: bool
    _episodes: dict[str, _Episode]
    _close_locked: Callable[[], None]
    _check_open: Callable[[], None]

    def _encoded(self, entry: dict[str, Any]) -> bytes | None:
        """``entry`` encoded by a journal that encodes apart from recording (``encode``),
        before the lock is taken (the lock is then held for less); ``None`` otherwise, or
        when encoding fails (:meth:`_log` then fails the same way under the lock)."""
        encode = getattr(self.journal, "encode", None)
        if encode is None:
            return None
        try:
            return encode(entry)
        except Exception:
            return None

    def _log(self, entry: dict[str, Any], payload: bytes | None = None) -> None:
        """Writes ``entry`` to the journal before the change it describes (under the lock);
        a failed write closes the env and raises, so the change never happens unlogged.
        ``payload``: the entry as :meth:`_encoded` made it."""
        if self.journal is None:
            return
        if self._journal_error is not None:
            raise EnvClosedError(f"the journal failed: {self._journal_error}")
        try:
            if payload is None:
                self.journal.record(entry)
            else:
                self.journal.record(entry, payload)  # type: ignore[call-arg]
        except BaseException as e:
            raise self._journal_failed(e, "the change was not made") from e

    @contextlib.contextmanager
    def commits_deferred(self) -> Iterator[Any]:
        """Within the block, this thread's calls do not commit the journal before they
        return: one commit at the block's end covers them all (a policy server runs a
        request's commands in one block and answers after it). Set ``covered = True`` on
        the yielded object when an answer that commits on its own will acknowledge them (a
        ``get_action`` queued after them: :meth:`send_actions` commits every entry
        recorded before its answer); then the block ends without a write. An error that
        leaves the block still commits (the calls that ran are acknowledged by the error
        answer). Not reentrant."""
        state = self._deferral
        if getattr(state, "active", False):
            raise RuntimeError("commits_deferred blocks do not nest")
        state.active, state.pending, state.covered = True, False, False
        try:
            yield state
        finally:
            state.active = False
            if state.pending and not state.covered:
                self._commit()

    def commit_journal(self) -> None:
        """Commits the journal now (what :meth:`commits_deferred` left pending, say before
        an error answer that acknowledges calls an answer would have covered)."""
        self._commit()

    def _commit(self) -> None:
        """Commits the journal before the caller's change is acknowledged (outside the lock,
        so that concurrent callers' entries go out together)."""
        if self.journal is None:
            return
        state = self._deferral
        if getattr(state, "active", False):
            state.pending = True
            return
        self._commit_now("the change was made but is not durable")

    def _commit_now(self, what: str) -> None:
        """Commits the journal (outside the lock); a failure closes the env and raises
        :class:`EnvClosedError` saying ``what`` became of the change."""
        try:
            self.journal.commit()  # type: ignore[union-attr]
        except BaseException as e:
            with self._lock:
                raise self._journal_failed(e, what) from e

    def _journal_failed(self, e: BaseException, what: str) -> EnvClosedError:
        """Closes the env after a journal failure (under the lock); returns the error."""
        if self._journal_error is None:
            self._journal_error = e
        self._close_locked()
        return EnvClosedError(
            f"the journal failed ({type(e).__name__}: {e}); {what}, and the env is closed"
        )

    def checkpoint_journal(self, log: Any = None) -> None:
        """An in-run checkpoint: shrinks the journal to what a crash could still lose, so
        that recovery replays only the episodes running now and what follows, however
        long the server ran.

        Call it from the sampler's thread (the one that polls this env), between two
        sample calls, once the outputs of every call so far are in the log: every step the
        env handed to the sampler is then stored, so the journal keeps only the ids of the
        finished episodes (still refused after a restart) and the entries of the running
        ones. ``log``: the :class:`~jaxsampler.offline.OfflineWriter` those outputs went
        to; it is synced (flushed and fsynced, so that a machine crash cannot take from the
        log what the journal no longer holds), and the journal notes where it ends, so
        that recovery reads the log only from there (without it, recovery reads the whole
        log and trusts only what it finds there).

        Clients wait while it runs (it holds the env's lock): it rewrites the running
        episodes' entries to a new file, fsyncs it and renames it over the journal.

        Raises:
            TypeError: the env has no journal, or one that cannot checkpoint.
            RuntimeError: called from a thread other than the one that polls the env
                (steps it polled may not be in the log yet).
            LogWriteError: the new journal could not be written; the old one is intact
                and the env serves on. When the journal fails after the switch, the env
                closes (:class:`EnvClosedError`, as for any journal failure).
        """
        journal = self.journal
        checkpoint = getattr(journal, "checkpoint", None)
        if journal is None or checkpoint is None:
            raise TypeError("checkpoint_journal needs an env with a StepJournal")
        poller = getattr(self, "_poll_thread", None)
        if poller is not None and poller != threading.get_ident():
            raise RuntimeError(
                "checkpoint_journal runs in the thread that polls the env (between sample "
                "calls), so that every step it polled is in the log"
            )
        offset = None
        if log is not None:  # on disk before the journal forgets what it holds
            log.sync()
            offset = getattr(log, "offset", None)
        with self._lock:
            self._check_open()
            try:
                checkpoint(list(self._episodes), offset)
            except BaseException as e:
                if getattr(journal, "failed", None) is not None:
                    raise self._journal_failed(e, "the checkpoint did not finish") from e
                raise

    def _drop(self, ep: _Episode, state: int) -> None:
        """Forgets a finished episode (its final step was polled): the journal may drop
        its entries (they are not needed after the next checkpoint)."""
        super()._drop(ep, state)  # type: ignore[misc]
        forget = getattr(self.journal, "forget", None)
        if forget is not None:
            forget(ep.eid)
