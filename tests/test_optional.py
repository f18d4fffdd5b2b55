"""A feature whose optional package is missing says which extra to install (pyproject.toml's)."""

import sys

import pytest

from vflash.cli import main


@pytest.fixture
def hidden(monkeypatch):
    # a module set to None in sys.modules fails to import, as an uninstalled one does
    def hide(*modules):
        for m in modules:
            monkeypatch.setitem(sys.modules, m, None)
    return hide


def test_plot_without_matplotlib_names_the_bench_extra(hidden, tmp_path, capsys):
    hidden("matplotlib", "matplotlib.pyplot")
    csv = tmp_path / "x.csv"
    csv.write_text("method,Nq,ms_median,tflops\n")
    with pytest.raises(SystemExit, match=r"vflash\[bench\]"):
        main(["plot", str(csv), "--out", str(tmp_path)])


def test_register_without_transformers_names_the_transformers_extra(hidden):
    hidden("transformers")
    import vflash.integrations.transformers as vt  # the module imports without transformers

    with pytest.raises(ImportError, match=r"vflash\[transformers\]"):
        vt.register()
