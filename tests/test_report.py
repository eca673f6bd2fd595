"""coursekit.report: the literature-vs-measured table and bars every chapter ends with."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from coursekit.report import literature_table, paired_bars  # noqa: E402


def test_paired_bars_draws_both_series_with_labels():
    fig, ax = plt.subplots()
    paired_bars(ax, ["a", "b"], [1.0, 2.0], [3.0, 4.0], source="TinyTL", fmt=lambda v: f"{v:.0f}x")
    heights = [p.get_height() for p in ax.patches]
    assert heights == [1.0, 2.0, 3.0, 4.0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["TinyTL", "measured here"]
    assert {t.get_text() for t in ax.texts} == {"1x", "2x", "3x", "4x"}
    plt.close(fig)


def test_paired_bars_rejects_mismatched_lengths():
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="2 labels, 1 reported and 2 measured"):
        paired_bars(ax, ["a", "b"], [1.0], [3.0, 4.0])
    plt.close(fig)


def test_literature_table_renders_markdown(monkeypatch):
    shown = []
    monkeypatch.setattr("coursekit.report.display", shown.append)
    literature_table([("memory", "6.9×", "2.1×", 6.9, 2.1)], source="Chen et al.")
    assert shown[0].data.splitlines() == ["| quantity | Chen et al. | measured here |", "|---|---|---|",
                                          "| memory | 6.9× | 2.1× |"]
