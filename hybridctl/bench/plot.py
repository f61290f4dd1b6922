"""`--plot FILE.png`: histograms of the four latency distributions (matplotlib, when installed)."""

from __future__ import annotations

from pathlib import Path

from hybridctl.bench.loadgen import LoadRun


class PlotUnavailable(RuntimeError):
    pass


def plot_latencies(run: LoadRun, path: str | Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on servers
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(
            "--plot needs matplotlib, which is not installed: `pip install matplotlib`, or drop --plot "
            "(the numbers are in the table and in --json)"
        ) from None
    ok = [r for r in run.records if r.ok]
    series = {
        "TTFT (ms)": [r.ttft_s * 1000 for r in ok if r.ttft_s is not None],
        "TPOT (ms)": [t * 1000 for r in ok if (t := r.tpot_s) is not None],
        "ITL (ms)": [x * 1000 for r in ok for x in r.itl_s],
        "E2E (ms)": [r.e2e_s * 1000 for r in ok],
    }
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (title, values) in zip(axes.flat, series.items(), strict=True):
        ax.set_title(title)
        if values:
            ax.hist(values, bins=min(40, max(5, len(values) // 2)))
        ax.set_ylabel("requests" if title != "ITL (ms)" else "tokens")
    fig.tight_layout()
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(out)  # atomic: a reader never sees half a PNG
    return out
