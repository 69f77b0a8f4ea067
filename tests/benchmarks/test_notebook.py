"""The notebooks run end to end (tiny sizes) and draw their plots."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")
pytest.importorskip("gymnasium")

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "throughput.ipynb"


@pytest.mark.slow
def test_throughput_notebook_runs_and_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel inherits this process's environment.
    monkeypatch.setenv("JAXSAMPLER_NOTEBOOK_QUICK", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # "python3" is ipykernel's own kernel: jupyter_client starts it with sys.executable,
    # i.e. the interpreter running pytest, so no kernelspec needs installing.
    client = nbclient.NotebookClient(
        nb,
        kernel_name="python3",
        timeout=120,
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()  # raises CellExecutionError if any cell fails

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 1, "expected exactly one plot (image/png output)"
    assert len(pngs[0]["data"]["image/png"]) > 1000


PPO_NOTEBOOK = NOTEBOOK.parent / "ppo.ipynb"


@pytest.mark.slow
def test_ppo_notebook_runs_and_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAXSAMPLER_NOTEBOOK_QUICK", "1")
    nb = nbformat.read(PPO_NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        kernel_name="python3",
        timeout=180,
        resources={"metadata": {"path": str(PPO_NOTEBOOK.parent)}},
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "zero on reset steps: True" in text and text.count("final mean return per seed") == 2
    assert [o for o in outputs if "image/png" in o.get("data", {})]
    assert_videos(outputs)


def assert_videos(outputs: list, max_bytes: int | None = None) -> None:
    """One HTML output holds an inline MP4 of CartPole and one of Pendulum, captioned."""
    htmls = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    htmls = ["".join(h) if isinstance(h, list) else h for h in htmls]
    media = [h for h in htmls if "<video" in h]
    assert len(media) == 1, f"expected one HTML output with the videos, got {len(media)}"
    html = media[0]
    srcs = re.findall(r'src="data:video/mp4;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(srcs) == 2, "expected two base64 MP4 videos"
    for src in srcs:
        data = base64.b64decode(src)
        assert data[4:8] == b"ftyp", "not an MP4 file"
        assert len(data) > 1000 and (max_bytes is None or len(data) <= max_bytes), len(data)
    for env_id in ("CartPole-v1", "Pendulum-v1"):
        assert f"{env_id}, seed 0, greedy: episode return" in html


def test_committed_ppo_notebook_holds_full_run_outputs() -> None:
    """The committed notebook carries the outputs of a full-size run: both envs trained at
    their default sizes, the learning curves and the two videos (each at most 500 kB)."""
    nb = nbformat.read(PPO_NOTEBOOK, as_version=4)
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "CartPole-v1: 499,712 steps/seed" in text and "Pendulum-v1: 999,424 steps/seed" in text
    assert [o for o in outputs if "image/png" in o.get("data", {})]
    assert_videos(outputs, max_bytes=500_000)


TOURS = {
    # notebook: (plots it draws, lines its run must print)
    "episodes_tour.ipynb": (2, ("chunks per call", "successor starts at t =", "truncated")),
    "multi_agent_tour.ipynb": (2, ("one game:", "policy 'x':", "policy 'o':")),
    "serving_tour.ipynb": (2, ("serving at http://", "the sampler's batches hold")),
    "scaling_tour.ipynb": (3, ("2 devices (mesh=2)", "NVIDIA H200")),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TOURS))
def test_tour_notebooks_run_and_plot(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The episodes, multi-agent, serving and scaling tours run end to end at tiny sizes; their own
    cells assert what they show (a continued chunk's first observation is the previous
    chunk's last, its lookback the step before; every step the serving clients sent is in
    the batches once), so a wrong claim fails here."""
    monkeypatch.setenv("JAXSAMPLER_NOTEBOOK_QUICK", "1")
    path = NOTEBOOK.parent / name
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=180, resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    plots, lines = TOURS[name]
    assert len([o for o in outputs if "image/png" in o.get("data", {})]) == plots
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    for line in lines:
        assert line in text
