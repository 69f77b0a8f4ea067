"""The throughput notebook runs end to end (tiny sizes) and draws its plot."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")
pytest.importorskip("gymnasium")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "throughput.ipynb"


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
    assert "zero on reset steps: True" in text and "final mean return per seed" in text
    assert [o for o in outputs if "image/png" in o.get("data", {})]
