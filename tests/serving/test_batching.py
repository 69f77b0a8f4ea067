"""``/batch`` scheduling on its own (:mod:`jaxsampler.serving.batching`): fake commands and a
fake connection, no server, no env. Every wait is bounded."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from jaxsampler.episodes.codec import unpackb
from jaxsampler.host_envs.external import WouldBlockError
from jaxsampler.serving.batching import FairBatches

BIG = b"x" * (16 << 10)  # over the inline size: the job goes to the batch pool


class FakeConn:
    """What a batch job touches of its connection; answers land in ``answers``."""

    def __init__(self) -> None:
        self.busy = False
        self.closing = False  # the peer is still there (a closed one's batch is dropped)
        self.answers: list = []
        self.answered = threading.Event()

    def respond(self, status: int, body: bytes) -> None:
        self.answers.append((status, unpackb(body)))

    def exception(self, e: BaseException) -> None:
        self.answers.append(("exception", e))

    def done_threadsafe(self, respond) -> None:
        respond()
        self.busy = False
        self.answered.set()


def test_a_small_batch_runs_inline_and_reports_refused_commands():
    ran = []

    def run(i, command, owner, block):
        if command == "bad":
            raise ValueError("refused")
        ran.append((i, command, owner, block))

    with ThreadPoolExecutor(1) as blocking:
        batches = FairBatches(blocking, lambda body, owner: ["a", "bad", "c"], run)
        conn = FakeConn()
        batches.start(conn, b"small", "me")  # answered before start returns: no thread
        batches.shutdown()
    assert ran == [(0, "a", "me", False), (2, "c", "me", False)] and not conn.busy
    ((status, result),) = conn.answers
    assert status == 200 and result["done"] == 2
    assert result["errors"] == [
        {"index": 1, "status": 400, "error": "InvalidDataError", "message": "refused"}
    ]


def test_a_body_that_does_not_decode_fails_the_whole_request():
    def commands_of(body, owner):
        raise ValueError("not msgpack")

    with ThreadPoolExecutor(1) as blocking:
        batches = FairBatches(blocking, commands_of, lambda *a: None)
        conn = FakeConn()
        batches.start(conn, b"small", None)
        batches.shutdown()
    ((kind, e),) = conn.answers
    assert kind == "exception" and str(e) == "not msgpack"


def test_big_batches_take_turns_a_slice_at_a_time():
    """Two connections' long batches hold both batch threads; a third connection's batch,
    queued behind them, runs after one slice of the first, not after all of it."""
    go = threading.Event()
    log: list = []
    lock = threading.Lock()

    def run(i, command, owner, block):
        if i == 0 and owner in ("A", "B"):
            assert go.wait(10.0)  # hang guard: both long jobs hold a thread until C queued
        time.sleep(0.0002)  # a command takes a moment (and lets the other threads run)
        with lock:
            log.append((owner, i))

    sizes = {"A": 320, "B": 320, "C": 32}
    with ThreadPoolExecutor(1) as blocking:
        batches = FairBatches(blocking, lambda body, owner: [None] * sizes[owner], run)
        conns = {k: FakeConn() for k in sizes}
        for k in sizes:
            batches.start(conns[k], BIG, k)
        go.set()
        for c in conns.values():
            assert c.answered.wait(10.0)
        batches.shutdown()
    for k, c in conns.items():
        assert c.answers == [(200, {"done": sizes[k], "errors": []})]
        assert [i for owner, i in log if owner == k] == list(range(sizes[k]))  # each once
    # C waited about one slice of each (whole batches in turn: all 640 commands of A and B)
    assert log.index(("C", 31)) < min(log.index(("A", 127)), log.index(("B", 127)))


def test_a_command_that_must_wait_for_room_finishes_the_batch_on_the_blocking_pool():
    calls = []

    def run(i, command, owner, block):
        calls.append((i, block))
        if i == 40 and not block:
            raise WouldBlockError("queue full")

    with ThreadPoolExecutor(1, thread_name_prefix="blocking") as blocking:
        batches = FairBatches(blocking, lambda body, owner: [None] * 50, run)
        conn = FakeConn()
        batches.start(conn, BIG, None)
        assert conn.answered.wait(10.0)
        batches.shutdown()
    assert conn.answers == [(200, {"done": 50, "errors": []})]
    assert calls == [(i, False) for i in range(41)] + [(i, True) for i in range(40, 50)]
