"""Offline writer durability and failure, with real faults: a killed process, a file size
limit (a full disk as the writer sees it), a replaced path. Before issue 32 a killed
writer lost what sat in its buffer, a failed write left a torn frame in the middle of the
log, and a replaced path was written into silently."""

from __future__ import annotations

import errno
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.offline import (
    CorruptLogError,
    GroupCommit,
    LogReplacedError,
    LogWriteError,
    OfflineWriter,
    TornTailWarning,
    TruncatedLogWarning,
    WriterFailedError,
    read_records,
)

ROOT = Path(__file__).resolve().parents[1]

#: Defines ``batch(i)`` in the child scripts: a small record that carries its number.
BATCH = """
import numpy as np
import jaxsampler as js
def batch(i):
    return js.SampleBatch({"i": np.array([i], np.int64), "obs": np.full(40, i, np.float32)})
"""


def batch(i: int) -> js.SampleBatch:
    return js.SampleBatch({"i": np.array([i], np.int64), "obs": np.full(40, i, np.float32)})


def numbers(path, expect: type[Warning] | None = None) -> list[int]:
    """The record numbers in a log; fails on any warning but ``expect`` (which must come)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = [int(r["i"][0]) for r in read_records(str(path))]
    assert [w.category for w in caught] == ([expect] if expect else []), [
        str(w.message) for w in caught
    ]
    return out


def child(script: str, *args: str, **kw) -> subprocess.Popen:
    """Runs ``script`` (after :data:`BATCH`) in a fresh interpreter on this tree."""
    code = BATCH + textwrap.dedent(script)
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


# -- a killed process ------------------------------------------------------------------


def test_a_killed_writer_loses_no_record_it_returned_from_and_the_next_one_reports_it(
    tmp_path,
):
    """Before: 20 small records sat in an 8 KiB user-space buffer; SIGKILL lost them."""
    raw, gz = tmp_path / "log.msgpack", tmp_path / "log.msgpack.gz"
    proc = child(
        """
        import sys, time
        from jaxsampler.offline import OfflineWriter
        writers = [OfflineWriter(p) for p in sys.argv[1:]]  # default settings
        for i in range(20):
            for w in writers:
                w.write(batch(i))
        print("written", flush=True)
        time.sleep(60)
        """,
        str(raw),
        str(gz),
    )
    try:
        assert proc.stdout.readline() == "written\n", proc.stderr.read()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert numbers(raw, TruncatedLogWarning) == list(range(20))  # no end frame: warned
    assert numbers(gz, TruncatedLogWarning) == list(range(20))  # the gzip stream ends early
    # a later writer appends; readers still report the session that ended badly, where
    # it ended, and read every record of both sessions
    crashed_at = raw.stat().st_size
    with OfflineWriter(str(raw), append=True) as w:
        w.write(batch(20))
    with pytest.warns(
        TruncatedLogWarning, match=f"ended without its end frame at byte {crashed_at}"
    ):
        back = [int(r["i"][0]) for r in read_records(str(raw))]
    assert back == list(range(21))
    with pytest.raises(CorruptLogError, match="cut .gz log"):  # as before: cut .gz is refused
        OfflineWriter(str(gz), append=True)


def test_a_gz_session_without_its_end_frame_is_reported_after_an_append(tmp_path):
    path = tmp_path / "log.msgpack.gz"
    proc = child(
        """
        import sys, time
        from jaxsampler.offline import OfflineWriter
        w = OfflineWriter(sys.argv[1])
        for i in range(3):
            w.write(batch(i))
        w._gz.close()  # the member ends (the stream is whole), but no end frame was written
        print("written", flush=True)
        time.sleep(60)
        """,
        str(path),
    )
    try:
        assert proc.stdout.readline() == "written\n", proc.stderr.read()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with OfflineWriter(str(path), append=True) as w:
        w.write(batch(3))
    with pytest.warns(TruncatedLogWarning, match="ended without its end frame"):
        assert [int(r["i"][0]) for r in read_records(str(path))] == [0, 1, 2, 3]


# -- a full disk -------------------------------------------------------------------------

FULL_DISK = """
import errno, json, resource, signal, sys
from jaxsampler.offline import LogWriteError, OfflineWriter, WriterFailedError, writer
writer.BUFFER_LIMIT = 4000  # flush="manual" writes out every 4 kB (the limit is 16 kB)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit write fails with EFBIG
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
path, out = sys.argv[1], {}
w = OfflineWriter(path, flush=sys.argv[2])
resource.setrlimit(resource.RLIMIT_FSIZE, (16_000, hard))
i = 0
try:
    while True:
        w.write(batch(i))
        i += 1
except LogWriteError as e:
    out.update(returned=i, errno=e.errno, failed=e.failed, lost=e.records, offset=e.offset,
               size=__import__("os").path.getsize(path), message=str(e))
try:
    w.write(batch(-1))  # still full
except LogWriteError as e:
    out["again"] = type(e).__name__
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space frees
try:
    for j in range(5):
        w.write(batch(1000 + j))
    w.close()
    out["after"] = "ok"
except LogWriteError as e:
    out["after"] = type(e).__name__
    w.close()
print(json.dumps(out))
"""


def run_full_disk(path, flush: str) -> dict:
    proc = child(FULL_DISK, str(path), flush)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    return json.loads(stdout)


def test_a_full_disk_cuts_the_failed_frame_and_writing_resumes_intact(tmp_path):
    """Before: the failed write left a partial frame in the file, and every record written
    after space freed sat behind a checksum mismatch (readable only after repair_log)."""
    path = tmp_path / "log.msgpack"
    out = run_full_disk(path, "record")
    assert out["errno"] == errno.EFBIG and out["lost"] == 1 and not out["failed"]
    assert out["offset"] == out["size"] < 16_000  # cut back to where the frame began
    assert f"at byte {out['offset']}" in out["message"] and str(path) in out["message"]
    assert out["again"] == "LogWriteError" and out["after"] == "ok"
    # every record write returned from, then the later ones, intact and closed
    assert numbers(path) == list(range(out["returned"])) + list(range(1000, 1005))


def test_a_full_disk_under_manual_flush_names_the_records_it_did_not_store(tmp_path):
    path = tmp_path / "log.msgpack"
    out = run_full_disk(path, "manual")
    assert out["errno"] == errno.EFBIG and out["lost"] > 1 and not out["failed"]
    assert "again" not in out and out["after"] == "ok"  # the next record was only buffered
    stored = out["returned"] + 1 - out["lost"]  # the failing call's record was buffered too
    assert stored > 10
    assert numbers(path) == list(range(stored)) + [-1] + list(range(1000, 1005))


def test_a_full_disk_fails_a_gz_writer_and_leaves_a_readable_stream(tmp_path):
    path = tmp_path / "log.msgpack.gz"
    out = run_full_disk(path, "record")
    assert (
        out["errno"] == errno.EFBIG
        and out["failed"]
        and "gzip stream cannot resume" in (out["message"])
    )
    assert out["again"] == "WriterFailedError" and out["after"] == "WriterFailedError"
    assert numbers(path, TruncatedLogWarning) == list(range(out["returned"]))


# -- a replaced path ---------------------------------------------------------------------


@pytest.mark.parametrize("how", ["renamed", "deleted", "directory", "another file"])
def test_a_replaced_path_raises_instead_of_writing_into_a_lost_file(tmp_path, how):
    """Before: the writer kept writing into the unlinked file, with no error."""
    path = tmp_path / "log.msgpack"
    w = OfflineWriter(str(path))
    w.write(batch(0))
    if how == "renamed":
        path.rename(tmp_path / "moved.msgpack")
    else:
        path.unlink()
    if how == "directory":
        path.mkdir()
    elif how == "another file":
        path.write_bytes(b"")
    with pytest.raises(LogReplacedError, match="log's path") as caught:
        w.write(batch(1))
    assert caught.value.failed and w.failed is caught.value
    with pytest.raises(WriterFailedError, match="refuses further writes") as again:
        w.write(batch(2))
    assert again.value.first is caught.value
    with pytest.raises(WriterFailedError):
        w.sync()
    w.close()  # the failure was raised already: closing does not raise again
    if how == "renamed":  # what was written before is where the file went, no end frame
        assert numbers(tmp_path / "moved.msgpack", TruncatedLogWarning) == [0]


def test_a_path_replaced_before_close_raises_at_close(tmp_path):
    path = tmp_path / "log.msgpack"
    w = OfflineWriter(str(path))
    path.unlink()
    with pytest.raises(LogReplacedError):
        w.close()
    w.close()  # closed now (idempotent)


def test_a_relative_path_is_checked_where_it_was_opened(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = OfflineWriter("log.msgpack")
    monkeypatch.chdir(ROOT)  # the name means another (absent) file from here
    w.write(batch(0))
    w.close()
    assert numbers(tmp_path / "log.msgpack") == [0]


# -- a cut that fails too ----------------------------------------------------------------


def test_a_failed_cut_back_fails_the_writer_and_the_next_append_cuts_the_tail(
    tmp_path, monkeypatch
):
    path = tmp_path / "log.msgpack"
    w = OfflineWriter(str(path))
    w.write(batch(0))
    size = path.stat().st_size
    real_write = os.write

    def short_writev(fd, parts):  # the disk takes 10 bytes of the frame, then is full
        return real_write(fd, b"".join(parts)[:10])

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    def no_cut(fd, length):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "writev", short_writev)
    monkeypatch.setattr(os, "write", full)
    monkeypatch.setattr(os, "ftruncate", no_cut)
    with pytest.raises(LogWriteError, match=f"cutting the file back to byte {size} failed") as e:
        w.write(batch(1))
    assert e.value.failed and e.value.errno == errno.ENOSPC and w.failed is e.value
    monkeypatch.undo()
    with pytest.raises(WriterFailedError, match="No space left") as again:
        w.write(batch(2))  # refused at once, though the disk works again
    assert again.value.first is e.value and again.value.__cause__ is e.value
    w.close()
    assert path.stat().st_size == size + 10  # the torn frame is there, at the end only
    torn = pytest.warns(TornTailWarning, match=f"removed 10 bytes .* at byte {size}")
    with torn, OfflineWriter(str(path), append=True) as w2:
        w2.write(batch(3))
    with pytest.warns(TruncatedLogWarning, match=f"ended without its end frame at byte {size}"):
        assert [int(r["i"][0]) for r in read_records(str(path))] == [0, 3]


def test_log_write_errors_pickle(tmp_path):
    e = LogWriteError("p", 7, "full", records=2, failed=True)
    back = pickle.loads(pickle.dumps(e))
    assert (back.path, back.offset, back.problem, back.records, back.failed) == (
        "p",
        7,
        "full",
        2,
        True,
    )
    f = pickle.loads(pickle.dumps(WriterFailedError(e)))
    assert isinstance(f, OSError) and f.first.problem == "full"


# -- flush and fsync settings ----------------------------------------------------------


class Fsyncs:
    """Counts fsync calls on the log's descriptor and on others (its directory)."""

    def __init__(self, monkeypatch):
        self.calls: list[int] = []
        real = os.fsync
        monkeypatch.setattr(os, "fsync", lambda fd: (self.calls.append(fd), real(fd))[1])

    def on(self, fd: int) -> int:
        return sum(c == fd for c in self.calls)


def test_fsync_false_never_fsyncs_until_sync(tmp_path, monkeypatch):
    fsyncs = Fsyncs(monkeypatch)
    w = OfflineWriter(str(tmp_path / "log.msgpack"))
    fd = w._out.fd
    for i in range(5):
        w.write(batch(i))
    assert fsyncs.calls == [] and w.synced == 0
    w.sync()
    assert fsyncs.on(fd) == 1 and len(fsyncs.calls) == 2  # and the new file's directory once
    assert w.synced == w.records == 5
    w.write(batch(5))
    w.sync()
    assert fsyncs.on(fd) == 2 and len(fsyncs.calls) == 3
    w.close()
    assert fsyncs.on(fd) == 2  # fsync=False: close does not fsync


def test_fsync_true_fsyncs_every_record_and_at_close(tmp_path, monkeypatch):
    fsyncs = Fsyncs(monkeypatch)
    w = OfflineWriter(str(tmp_path / "log.msgpack"), fsync=True)
    fd = w._out.fd
    for i in range(4):
        w.write(batch(i))
        assert fsyncs.on(fd) == i + 1 and w.synced == i + 1
    w.close()
    assert fsyncs.on(fd) == 5
    assert numbers(tmp_path / "log.msgpack") == [0, 1, 2, 3]


def test_group_commit_every_n_records(tmp_path, monkeypatch):
    fsyncs = Fsyncs(monkeypatch)
    w = OfflineWriter(str(tmp_path / "log.msgpack"), fsync=GroupCommit(records=3))
    fd = w._out.fd
    synced = []
    for i in range(10):
        w.write(batch(i))
        synced.append(w.synced)
    assert synced == [0, 0, 3, 3, 3, 6, 6, 6, 9, 9] and fsyncs.on(fd) == 3
    w.close()  # the last record and the end frame
    assert fsyncs.on(fd) == 4 and w.synced == 10


def test_group_commit_every_n_seconds_by_the_age_of_the_oldest_unsynced_record(
    tmp_path, monkeypatch
):
    fsyncs = Fsyncs(monkeypatch)
    now = [0.0]
    policy = GroupCommit(seconds=0.010, clock=lambda: now[0])
    w = OfflineWriter(str(tmp_path / "log.msgpack"), fsync=policy)
    fd = w._out.fd
    synced = []
    for t in (0.0, 0.004, 0.009, 0.010, 0.015, 0.030, 0.031):
        now[0] = t
        w.write(batch(len(synced)))
        synced.append(w.synced)
    # 0.010: the record of 0.000 is 10 ms old; 0.030: the one of 0.015 is 15 ms old
    assert synced == [0, 0, 0, 4, 4, 6, 6] and fsyncs.on(fd) == 2
    w.close()


def test_group_commit_records_or_seconds_whichever_first(tmp_path, monkeypatch):
    fsyncs = Fsyncs(monkeypatch)
    now = [0.0]
    w = OfflineWriter(
        str(tmp_path / "log.msgpack"),
        fsync=GroupCommit(records=2, seconds=1.0, clock=lambda: now[0]),
    )
    fd = w._out.fd
    w.write(batch(0))
    w.write(batch(1))  # two records
    now[0] = 5.0
    w.write(batch(2))  # nothing older than 1 s waits... itself is new
    now[0] = 6.5
    w.write(batch(3))  # the record of 5.0 is 1.5 s old
    assert fsyncs.on(fd) == 2 and w.synced == 4
    w.close()


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_flush_record_puts_each_record_in_the_file_manual_waits_for_flush(tmp_path, suffix):
    path = tmp_path / f"log.msgpack{suffix}"
    with OfflineWriter(str(path)) as w:
        for i in range(3):
            w.write(batch(i))
            assert numbers(path, TruncatedLogWarning) == list(range(i + 1))
    manual = tmp_path / f"manual.msgpack{suffix}"
    with OfflineWriter(str(manual), flush="manual") as w:
        for i in range(3):
            w.write(batch(i))
        # still in the writer's buffer (or gzip's compressor): not in the file yet
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                assert list(read_records(str(manual))) == []
            except CorruptLogError:  # a .gz holding only its gzip header and no data
                assert suffix == ".gz"
        w.flush()
        assert numbers(manual, TruncatedLogWarning) == [0, 1, 2]
    assert numbers(manual) == [0, 1, 2]


def test_manual_flush_writes_out_past_the_buffer_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(js.offline.writer, "BUFFER_LIMIT", 500)
    path = tmp_path / "log.msgpack"
    with OfflineWriter(str(path), flush="manual") as w:
        w.write(batch(0))
        assert path.stat().st_size == len(js.offline.frames._HEADERS[2])
        while path.stat().st_size == len(js.offline.frames._HEADERS[2]):
            w.write(batch(w.records))
        written = w.records
    assert numbers(path) == list(range(written))


def test_gz_record_flush_costs_ratio_but_stays_one_member_per_session(tmp_path):
    path, manual = tmp_path / "a.gz", tmp_path / "b.gz"
    for p, flush in ((path, "record"), (manual, "manual")):
        with OfflineWriter(str(p), flush=flush) as w:
            for i in range(50):
                w.write(batch(i))
    assert numbers(path) == numbers(manual) == list(range(50))
    assert path.stat().st_size > manual.stat().st_size  # a sync flush per record
    assert path.read_bytes().count(b"\x1f\x8b\x08") == 1  # one gzip member


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"flush": "always"}, ValueError, "flush must be 'record' or 'manual', got 'always'"),
        ({"fsync": 1}, TypeError, "fsync must be a bool or a GroupCommit, got 1"),
        ({"fsync": "10ms"}, TypeError, "got '10ms'"),
    ],
)
def test_bad_settings_are_named(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        OfflineWriter(str(tmp_path / "log.msgpack"), **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "needs records=, seconds= or both"),
        ({"records": 0}, "records must be an int >= 1, got 0"),
        ({"records": True}, "got True"),
        ({"seconds": 0.0}, "seconds must be > 0 and finite, got 0.0"),
        ({"seconds": float("inf")}, "got inf"),
    ],
)
def test_bad_group_commit_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GroupCommit(**kwargs)


def test_a_closed_writer_refuses_writes(tmp_path):
    w = OfflineWriter(str(tmp_path / "log.msgpack"))
    w.close()
    with pytest.raises(ValueError, match="closed OfflineWriter"):
        w.write(batch(0))


def test_repair_keeps_every_record_around_a_resume_frame(tmp_path):
    path, out = tmp_path / "log.msgpack", tmp_path / "fixed.msgpack"
    with OfflineWriter(str(path)) as w:
        w.write(batch(0))
        w.write(batch(1))
    path.write_bytes(path.read_bytes()[:-21])  # the end frame is gone: a crashed session
    with OfflineWriter(str(path), append=True) as w:
        w.write(batch(2))
    assert path.read_bytes().count(b"\xc1JSL\x02") == 1  # one resume frame
    report = js.offline.repair_log(str(path), str(out))
    assert report.records == 3 and not report.dropped and report.end_frame
    assert numbers(out) == [0, 1, 2]  # a closed log, nothing to warn about
