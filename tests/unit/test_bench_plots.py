"""The bench's charts are written as palette PNGs (a third of an RGBA PNG's size)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtserver.tools.bench.plots import save_png


def test_a_chart_is_a_palette_png_of_the_figures_size(tmp_path: Path) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([1, 2, 3], [3, 1, 2], "o-", color="tab:red")
    ax.set_title("a chart")
    path = tmp_path / "chart.png"
    save_png(fig, path)
    plt.close(fig)
    with Image.open(path) as image:
        assert image.format == "PNG" and image.mode == "P"
        assert image.size == (440, 330)  # 4 x 3 inches at the charts' 110 dpi
        colors = [c for _, c in image.convert("RGB").getcolors(256) or []]
    assert any(r > 180 and g < 80 and b < 80 for r, g, b in colors)  # the red line
