"""jaxsampler.integrations.loggers: what each logger writes, read back independently of the
logger."""

from __future__ import annotations

import json
import math
import struct
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsampler as js
from jaxsampler.integrations import loggers
from jaxsampler.sampling.callbacks import SampleReport, SamplerTotals

NUM_CALLS = 3


class Recorder:
    """A plain callback: keeps every report (the reference the loggers are checked against)."""

    def __init__(self):
        self.reports: list[SampleReport] = []

    def on_sample_end(self, report):
        self.reports.append(report)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One tiny CartPole sampler with a JSONL logger, a TensorBoard logger and a
    recorder as callbacks; after each call, what the sampler says and what the JSONL
    file holds at that moment."""
    d = tmp_path_factory.mktemp("loggers")
    env = js.make("CartPole-v1")
    # shapes no other test uses, so the first call compiles in this process
    pol = js.MLPPolicy(env.observation_space, env.action_space, (7,))
    params = pol.init(jax.random.PRNGKey(0))
    jl = loggers.JsonlLogger(d / "run" / "metrics.jsonl")
    tb = loggers.TensorBoardLogger(d / "tb")
    rec = Recorder()
    sampler = js.Sampler(env, pol, num_envs=3, rollout_length=29, seed=1, callbacks=[jl, tb, rec])
    after = []
    for _ in range(NUM_CALLS):
        sampler.sample(params)
        lines = (d / "run" / "metrics.jsonl").read_text().splitlines()  # flushed per line
        after.append(
            {
                "metrics": sampler.metrics.as_dict(),
                "env_steps": sampler.totals.env_steps,
                "lines": [json.loads(x) for x in lines],
            }
        )
    # a training loop's own scalars, at the current step
    jl.log({"loss": np.float32(0.25), "lr": jnp.asarray(3e-4)}, step=sampler.totals.env_steps)
    tb.log({"loss": 0.25, "lr": 3e-4}, step=sampler.totals.env_steps)
    jl.close()
    tb.close()
    return types.SimpleNamespace(dir=d, jsonl=jl, tb=tb, rec=rec, after=after)


def test_jsonl_lines_equal_the_samplers_metrics_after_each_call(run):
    for i, snap in enumerate(run.after):
        assert len(snap["lines"]) == i + 1  # one line per call, written before the next
        line = snap["lines"][-1]
        m = snap["metrics"]
        assert line["step"] == snap["env_steps"]
        assert line["sampler/total_env_steps"] == snap["env_steps"]
        assert line["sampler/num_env_steps_sampled"] == m["num_env_steps_sampled"]
        assert line["sampler/num_episodes_completed"] == m["num_episodes_completed"]
        if math.isnan(m["episode_return_mean"]):
            assert "sampler/episode_return_mean" not in line
        else:
            assert line["sampler/episode_return_mean"] == m["episode_return_mean"]
            assert line["sampler/episode_len_max"] == m["episode_len_max"]
        assert line["sampler/env_steps_per_s"] > 0 and isinstance(line["time"], float)
    steps = [ln["step"] for ln in run.after[-1]["lines"]]
    assert steps == sorted(steps) and len(set(steps)) == NUM_CALLS
    # some episodes finished (CartPole with a random-ish policy ends within ~30 steps)
    assert any("sampler/episode_return_mean" in ln for ln in run.after[-1]["lines"])


def test_jsonl_line_is_the_reports_scalars(run):
    lines = [json.loads(x) for x in (run.dir / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == NUM_CALLS + 1
    assert len(run.rec.reports) == NUM_CALLS  # the last line is the learner's own log call
    for line, report in zip(lines[:NUM_CALLS], run.rec.reports, strict=True):
        body = {k: v for k, v in line.items() if k not in ("step", "time", "compile")}
        assert body == report.scalars()
        assert line["step"] == report.step
    assert lines[-1]["loss"] == 0.25 and lines[-1]["lr"] == pytest.approx(3e-4)
    assert lines[-1]["step"] == lines[-2]["step"]


def test_compile_events_are_noted_on_the_first_call_only(run):
    lines = run.after[-1]["lines"]
    assert lines[0]["sampler/num_compiles"] > 0 and lines[0]["sampler/compile_s"] > 0
    assert lines[0]["compile"]["num_compiles"] == lines[0]["sampler/num_compiles"]
    for ln in lines[1:]:
        assert ln["sampler/num_compiles"] == 0 and "compile" not in ln
    assert len(run.jsonl.compile_events) == 1 == len(run.tb.compile_events)
    ev = run.jsonl.compile_events[0]
    assert ev.step == lines[0]["step"] and ev.num_compiles == lines[0]["sampler/num_compiles"]


# --------------------------------------------------------------------------- TensorBoard


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_tfrecords(path: Path) -> list[bytes]:
    """The records of a TFRecord file: u64 length, masked CRC-32C of the length, data,
    masked CRC-32C of the data (both checksums checked)."""
    raw = path.read_bytes()
    out, i = [], 0
    while i < len(raw):
        (n,) = struct.unpack_from("<Q", raw, i)
        (len_crc,) = struct.unpack_from("<I", raw, i + 8)
        assert len_crc == _masked(_crc32c(raw[i : i + 8]))
        data = raw[i + 12 : i + 12 + n]
        (data_crc,) = struct.unpack_from("<I", raw, i + 12 + n)
        assert data_crc == _masked(_crc32c(data))
        out.append(data)
        i += 12 + n + 4
    return out


def read_events(logdir: Path):
    from tensorboardX.proto.event_pb2 import Event

    files = sorted(logdir.glob("events.out.tfevents.*"))
    assert len(files) == 1, files
    scalars: dict[str, list[tuple[int, float]]] = {}
    texts = []
    for rec in read_tfrecords(files[0]):
        ev = Event.FromString(rec)
        for v in ev.summary.value:
            if v.HasField("simple_value"):
                scalars.setdefault(v.tag, []).append((ev.step, v.simple_value))
            else:
                texts.append((ev.step, v.tag, [s.decode() for s in v.tensor.string_val]))
    return scalars, texts


def test_tensorboard_event_file_holds_every_scalar_at_its_step(run):
    scalars, texts = read_events(run.dir / "tb")
    for report in run.rec.reports:
        for tag, value in report.scalars().items():
            assert (report.step, np.float32(value)) in scalars[tag], tag
    ret = scalars.get("sampler/total_env_steps")
    assert [s for s, _ in ret] == [r.step for r in run.rec.reports]
    assert scalars["loss"] == [(run.rec.reports[-1].step, 0.25)]
    # the compile event: one text entry at the first call's step
    assert len(texts) == 1
    step, tag, (text,) = texts[0]
    assert step == run.rec.reports[0].step and tag.startswith("sampler/compile")
    assert f"{run.rec.reports[0].num_compiles} XLA compilation" in text


def test_tensorboard_missing_package_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[tensorboard\]"'):
        loggers.TensorBoardLogger(tmp_path)
    with pytest.raises(ImportError, match="tensorboard"):
        loggers.make_logger("tensorboard", tmp_path)


# --------------------------------------------------------------------------- W&B


def fake_wandb(active_run=None):
    calls = []

    class FakeRun:
        def __init__(self, name):
            self.name = name
            self.finished = False

        def log(self, data, step=None):
            calls.append(("log", self.name, dict(data), step))

        def finish(self):
            self.finished = True
            calls.append(("finish", self.name))

    mod = types.ModuleType("wandb")
    mod.run = active_run(FakeRun) if active_run else None

    def init(**kwargs):
        calls.append(("init", kwargs))
        mod.run = FakeRun("started")
        return mod.run

    mod.init = init
    mod.termlog = lambda msg: calls.append(("termlog", msg))
    return mod, calls


def report(env_steps, num_compiles=0, ret=1.5):
    m = js.sampling.SamplerMetrics(num_env_steps_sampled=10, episode_return_mean=ret)
    return SampleReport(
        metrics=m,
        totals=SamplerTotals(calls=1, env_steps=env_steps),
        rollout_s=0.5,
        convert_s=0.5,
        compile_s=0.25 * num_compiles,
        num_compiles=num_compiles,
    )


def test_wandb_starts_a_run_logs_reports_and_finishes_it(monkeypatch, tmp_path):
    mod, calls = fake_wandb()
    monkeypatch.setitem(sys.modules, "wandb", mod)
    lg = loggers.make_logger("wandb", tmp_path / "w", project="p", name="n")
    r0, r1 = report(10, num_compiles=3), report(20)
    lg.on_sample_end(r0)
    lg.on_sample_end(r1)
    lg.log({"loss": np.float64(0.5)}, step=20)
    lg.close()
    lg.close()  # idempotent
    assert calls[0] == ("init", {"project": "p", "name": "n", "dir": str(tmp_path / "w")})
    assert calls[1] == ("log", "started", r0.scalars(), 10)
    assert calls[2][0] == "termlog" and "3 XLA compilation(s), 0.750 s" in calls[2][1]
    assert calls[3] == ("log", "started", r1.scalars(), 20)
    assert calls[4] == ("log", "started", {"loss": 0.5}, 20)
    assert calls[5] == ("finish", "started") and len(calls) == 6
    assert r0.scalars()["sampler/episode_return_mean"] == 1.5
    assert r0.scalars()["sampler/env_steps_per_s"] == 10.0


def test_wandb_logs_to_an_existing_run_and_leaves_it_open(monkeypatch):
    mod, calls = fake_wandb(active_run=lambda FakeRun: FakeRun("active"))
    monkeypatch.setitem(sys.modules, "wandb", mod)
    with loggers.WandbLogger(project="ignored") as lg:
        lg.log({"x": 1}, step=0)
    assert calls == [("log", "active", {"x": 1.0}, 0)] and not mod.run.finished
    other = type(mod.run)("given")
    lg = loggers.WandbLogger(run=other)
    lg.log({"y": 2}, step=3)
    lg.close()
    assert calls[-1] == ("log", "given", {"y": 2.0}, 3) and not other.finished


def test_wandb_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"pip install -e \"\.\[wandb\]\""):
        loggers.WandbLogger()


def test_real_wandb_offline(monkeypatch, tmp_path):
    wandb = pytest.importorskip("wandb", reason="wandb is not installed (optional)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    lg = loggers.WandbLogger(project="jaxsampler-test", dir=str(tmp_path))
    lg.on_sample_end(report(10, num_compiles=1))
    lg.log({"loss": 0.5}, step=10)  # merged into step 10's row
    lg.on_sample_end(report(20, ret=2.5))  # a later step: W&B commits step 10's row
    summary = dict(lg.run.summary)
    assert summary["_step"] == 10 and summary["loss"] == 0.5
    assert summary["sampler/episode_return_mean"] == 1.5
    lg.close()
    assert wandb.run is None  # the run this logger started is finished
    assert list(tmp_path.glob("wandb/offline-run-*")), "no offline run directory written"


# --------------------------------------------------------------------------- bad input, misc


@pytest.mark.parametrize(
    "bad", ["1.0", None, [1.0, 2.0], np.zeros(2), jnp.zeros(3), {"a": 1}, np.array("x")]
)
def test_non_number_scalar_raises_type_error_naming_the_key(tmp_path, bad):
    with (
        loggers.JsonlLogger(tmp_path / "m.jsonl") as lg,
        pytest.raises(TypeError, match="'sampler/weird'"),
    ):
        lg.log({"ok": 1.0, "sampler/weird": bad}, step=0)
    assert (tmp_path / "m.jsonl").read_text() == ""  # nothing half-written
    with pytest.raises(TypeError, match="'sampler/weird'"):
        loggers.NullLogger().log({"sampler/weird": bad}, step=0)


def test_bad_steps_keys_and_closed_loggers(tmp_path):
    lg = loggers.JsonlLogger(tmp_path / "m.jsonl")
    with pytest.raises(TypeError, match="step must be an integer"):
        lg.log({"a": 1.0}, step=1.5)
    with pytest.raises(ValueError, match="step must be >= 0"):
        lg.log({"a": 1.0}, step=-1)
    with pytest.raises(TypeError, match="names must be strings"):
        lg.log({3: 1.0}, step=0)
    with pytest.raises(ValueError, match="'step' is reserved"):
        lg.log({"step": 1.0}, step=0)
    lg.log({"a": 1.0}, step=np.int64(4))
    lg.close()
    with pytest.raises(ValueError, match="JsonlLogger is closed"):
        lg.log({"a": 1.0}, step=5)
    with pytest.raises(ValueError, match="closed"):
        lg.on_sample_end(report(5))
    with pytest.raises(IsADirectoryError):
        loggers.JsonlLogger(tmp_path)


def test_jsonl_nan_is_null_and_the_file_is_appended(tmp_path):
    path = tmp_path / "sub" / "m.jsonl"
    with loggers.JsonlLogger(path) as lg:
        lg.log({"a": float("nan"), "b": float("inf"), "c": 2}, step=0)
    with loggers.JsonlLogger(path) as lg:  # a resumed run continues the file
        lg.log({"a": 1.0}, step=1)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    first, second = (json.loads(x) for x in text.splitlines())
    assert first["a"] is None and first["b"] is None and first["c"] == 2.0
    assert second["a"] == 1.0 and second["step"] == 1
    back = loggers.read_jsonl(path)
    assert math.isnan(back[0]["a"]) and back[1]["a"] == 1.0


def test_multi_logger_fans_out_and_closes_all(tmp_path):
    a = loggers.JsonlLogger(tmp_path / "a.jsonl")
    b = loggers.JsonlLogger(tmp_path / "b.jsonl")
    with loggers.MultiLogger(a, b, loggers.NullLogger()) as multi:
        multi.on_sample_end(report(10, num_compiles=2))
        multi.log({"loss": 1.0}, step=10)
        with pytest.raises(TypeError, match="'loss'"):
            multi.log({"loss": "x"}, step=10)
    assert a.closed and b.closed
    la, lb = loggers.read_jsonl(tmp_path / "a.jsonl"), loggers.read_jsonl(tmp_path / "b.jsonl")
    assert [{k: v for k, v in x.items() if k != "time"} for x in la] == [
        {k: v for k, v in x.items() if k != "time"} for x in lb
    ]
    assert len(la) == 2 and la[0]["compile"] == {"num_compiles": 2, "compile_s": 0.5}
    assert len(multi.compile_events) == len(a.compile_events) == 1
    with pytest.raises(TypeError, match="Logger instances"):
        loggers.MultiLogger(object())


def test_make_logger_kinds(tmp_path):
    lg = loggers.make_logger("jsonl", tmp_path)
    assert isinstance(lg, loggers.JsonlLogger) and lg.path == tmp_path / "metrics.jsonl"
    lg.close()
    assert isinstance(loggers.make_logger("none"), loggers.NullLogger)
    with pytest.raises(ValueError, match="jsonl, tensorboard, wandb, none"):
        loggers.make_logger("csv", tmp_path)
    with pytest.raises(ValueError, match="needs a log directory"):
        loggers.make_logger("jsonl")


def test_sampler_refuses_callbacks_without_on_sample_end():
    env = js.make("CartPole-v1")
    pol = js.RandomPolicy(env.observation_space, env.action_space)
    with pytest.raises(TypeError, match="on_sample_end"):
        js.Sampler(env, pol, num_envs=2, rollout_length=4, callbacks=[Recorder(), object()])
    with pytest.raises(TypeError, match="on_sample_end"):
        js.Sampler(env, pol, num_envs=2, rollout_length=4, callbacks=print)
    # a Logger is accepted as a callback, alone or in a list
    js.Sampler(env, pol, num_envs=2, rollout_length=4, callbacks=loggers.NullLogger())


def test_command_line_flags(tmp_path):
    import argparse

    p = argparse.ArgumentParser()
    loggers.add_arguments(p)
    a = p.parse_args([])
    assert a.log_dir is None and a.logger is None and a.quiet is None  # quiet: automatic
    assert isinstance(loggers.from_arguments(a), loggers.NullLogger)
    a = p.parse_args(["--log-dir", str(tmp_path), "--quiet"])
    assert a.quiet is True
    with loggers.from_arguments(a) as lg:
        assert isinstance(lg, loggers.JsonlLogger) and lg.path == tmp_path / "metrics.jsonl"
    a = p.parse_args(["--logger", "none", "--log-dir", str(tmp_path)])
    assert isinstance(loggers.from_arguments(a), loggers.NullLogger)
    with pytest.raises(ValueError, match="--log-dir"):
        loggers.from_arguments(p.parse_args(["--logger", "tensorboard"]))
    with pytest.raises(SystemExit):
        p.parse_args(["--logger", "csv"])


def test_log_history_writes_one_line_per_update(tmp_path):
    ret = np.array([np.nan, 10.0, np.nan, 30.0], np.float32)
    with loggers.JsonlLogger(tmp_path / "h.jsonl") as lg:
        n = loggers.log_history(
            lg,
            {"ret": ret, "eps": jnp.array([0, 2, 0, 1])},
            steps_per_update=8,
            start_step=100,
            final={"env_steps_per_s": 5.0},
        )
    lines = loggers.read_jsonl(tmp_path / "h.jsonl")
    assert n == 4 == len(lines)
    assert [x["step"] for x in lines] == [108, 116, 124, 132]
    assert ["ret" in x for x in lines] == [False, True, False, True]
    assert lines[1]["ret"] == 10.0 and lines[3]["ret"] == 30.0
    assert [x["eps"] for x in lines] == [0, 2, 0, 1]
    assert lines[3]["env_steps_per_s"] == 5.0 and "env_steps_per_s" not in lines[2]
    with pytest.raises(ValueError, match="one length"):
        loggers.log_history(lg, {"a": [1, 2], "b": [1]}, steps_per_update=1)
