"""Pictures of the benchmarks' saved results: PNG plots drawn from their JSON, with no new measurement.

    .venv/bin/python benchmarks/plot.py                       every result in benchmarks/results/, drawn
                                                              into benchmarks/plots/ with a copy of each result
    .venv/bin/python benchmarks/plot.py benchmarks/plots/*.json --out /tmp/plots    the README's, drawn again

``allreduce.json`` gives ``allreduce.png`` (bus bandwidth against array size, a panel per process
count, a line per tool; ``broadcast.json`` and ``allgather.json`` likewise), ``launch.json`` gives
``launch.png`` (launch wall time against N) and
``scaling.json`` gives ``scaling.png`` (samples/s on 1 and 2 instances against perfect scaling). Each
picture says under it which commit, date, mode and load produced it. The benchmarks call this after
their run when matplotlib is installed (``pip install -e '.[bench]'``); nothing else needs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
PLOTS_DIR = HERE / "plots"
#: One look per tool in every picture; a tool not listed here gets matplotlib's next colour.
STYLE: dict[str, dict[str, Any]] = {
    "poprun": {"color": "tab:blue", "marker": "o", "linewidth": 2.2},
    "poprun-tcp": {"color": "tab:blue", "marker": "o", "linestyle": "--", "alpha": 0.6},
    "poprun-new": {"color": "tab:blue", "marker": "o", "linestyle": ":", "alpha": 0.6},
    "hvd": {"color": "tab:purple", "marker": "D", "alpha": 0.8},
    "hvd-plain": {"color": "tab:purple", "marker": "D", "linestyle": ":", "alpha": 0.5},
    "mpi4py": {"color": "tab:orange", "marker": "s"},
    "mpirun": {"color": "tab:orange", "marker": "s"},
    "gloo": {"color": "tab:green", "marker": "^"},
    "torchrun": {"color": "tab:green", "marker": "^"},
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def provenance(report: dict[str, Any], path: Path) -> str:
    """Which run a picture comes from: commit, date, mode, load average (what the JSON recorded)."""
    machine = report.get("machine", {})
    git = machine.get("git", {})
    commit = git.get("commit") or report.get("commit", "?")
    if git.get("src_modified") == "yes":
        commit += " (+ local changes)"
    date = machine.get("date") or report.get("date") or _mtime(path)  # older scaling.json files have no date
    parts = [f"commit {commit}", str(date)[:16].replace("T", " ")]
    if report.get("mode"):
        parts.append(f"{report['mode']} run")
    before, after = report.get("loadavg_before"), report.get("loadavg_after")
    if before and after:
        parts.append(f"load {before[0]:.1f} before, {after[0]:.1f} after")
    cores = machine.get("cores") or report.get("cores")
    if cores:
        parts.append(f"{cores} cores (shared)")
    return f"{path.name}: " + ", ".join(p for p in parts if p)


def _mtime(path: Path) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc).isoformat()


def _size_label(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def plot_allreduce(report: dict[str, Any], path: Path, out: Path) -> Path:
    """Bus bandwidth against size, a panel per N; also broadcast.json and allgather.json (benchmarks/collectives.py)."""
    plt = _pyplot()
    collective = report.get("collective", "allreduce")
    rows = report["summary"]
    counts = sorted({row["n"] for row in rows})
    fig, axes = plt.subplots(1, len(counts), figsize=(5.2 * len(counts), 4.2), sharey=True, squeeze=False)
    for ax, n in zip(axes[0], counts):
        tools = sorted({row["tool"] for row in rows if row["n"] == n},
                       key=lambda t: (t not in STYLE, list(STYLE).index(t) if t in STYLE else 0, t))
        for tool in tools:
            mine = sorted((row for row in rows if row["n"] == n and row["tool"] == tool), key=lambda r: r["bytes"])
            ax.plot([r["bytes"] for r in mine], [r["busbw_gbs"] for r in mine], label=tool, **STYLE.get(tool, {}))
        sizes = sorted({row["bytes"] for row in rows})
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [_size_label(s) for s in sizes])
        ax.set_title(f"N = {n} processes")
        ax.set_xlabel("array size (float32 sum)" if collective == "allreduce" else "result size (float32)")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    axes[0][0].set_ylabel("bus bandwidth, GB/s (higher is better)")
    fig.suptitle(f"{collective}: poprun-py's fabric against mpi4py (Open MPI) and torch gloo")
    return _save(fig, plt, out / f"{collective}.png", provenance(report, path))


def plot_launch(report: dict[str, Any], path: Path, out: Path) -> Path:
    plt = _pyplot()
    rows = sorted(report["launch"]["summary"], key=lambda r: r["n"])
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    for tool in ("poprun", "mpirun", "torchrun"):
        points = [(r["n"], r[f"{tool}_median_s"]) for r in rows if r.get(f"{tool}_median_s") is not None]
        if points:
            ax.plot(*zip(*points), label=tool, **STYLE.get(tool, {}))
        for r in rows:  # runs that hung or failed are left out of the median: say so on the point
            if r.get(f"{tool}_unfinished") and r.get(f"{tool}_median_s") is not None:
                ax.annotate(f"{tool}: {r[f'{tool}_unfinished']} runs hung,\nleft out", (r["n"], r[f"{tool}_median_s"]),
                            textcoords="offset points", xytext=(-6, 6), ha="right", fontsize=8)
    ns = [r["n"] for r in rows]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(FixedLocator([0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g} s"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("instances N")
    ax.set_ylabel("wall time of a launch of `true` (lower is better)")
    ax.set_title("launch time: poprun-py, mpirun and torchrun (medians)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, plt, out / "launch.png", provenance(report, path))


def plot_scaling(report: dict[str, Any], path: Path, out: Path) -> Path:
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter

    rows = report["summary"]
    networks = list(dict.fromkeys(row["network"] for row in rows))
    fig, axes = plt.subplots(1, len(networks), figsize=(5.0 * len(networks), 4.2), squeeze=False)
    for ax, network in zip(axes[0], networks):
        mine = sorted((r for r in rows if r["network"] == network), key=lambda r: r["instances"])
        base = mine[0]["samples_per_s"] / mine[0]["instances"]
        labels = [f"{r['instances']} instance{'s' if r['instances'] > 1 else ''}" for r in mine]
        bars = ax.bar(labels, [r["samples_per_s"] for r in mine], color="tab:blue", label="measured")
        for i, (bar, row) in enumerate(zip(bars, mine)):
            ax.hlines(base * row["instances"], bar.get_x(), bar.get_x() + bar.get_width(), colors="k",
                      linestyles="--", label=None if i else "perfect scaling (N x 1 instance)", zorder=3)
        for bar, row in zip(bars, mine):
            ax.annotate(f"{row['samples_per_s']:,.0f}/s\n{100 * (row['efficiency'] or 0):.0f}% efficient",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
        ax.set_title(f"{network} network, batch per replica fixed")
        ax.set_ylabel("training samples/s (higher is better)")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
        ax.margins(y=0.25)
        ax.legend(loc="upper left")
    fig.suptitle("examples/train.py on 1 and 2 instances (weak scaling)")
    return _save(fig, plt, out / "scaling.png", provenance(report, path))


def _save(fig: Any, plt: Any, target: Path, caption: str) -> Path:
    fig.text(0.01, 0.01, caption, fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


PLOTTERS: dict[str, Callable[[dict[str, Any], Path, Path], Path]] = {
    "allreduce.json": plot_allreduce, "launch.json": plot_launch, "scaling.json": plot_scaling,
    "broadcast.json": plot_allreduce, "allgather.json": plot_allreduce,
}


def plot_file(path: Path, out: Path = PLOTS_DIR, kind: str | None = None) -> Path:
    """The picture of one saved result (its kind is its file name, as the benchmarks write it, unless given)."""
    kind = kind or next((name for name in PLOTTERS if path.name.endswith(name)), None)
    if kind is None:
        raise SystemExit(f"{path}: no plot for this file; give one of {', '.join(PLOTTERS)}")
    return PLOTTERS[kind](json.loads(path.read_text()), path, out)


def plot_after_run(path: Path, kind: str) -> None:
    """Called by a benchmark once its JSON is written (``kind``: its default file name, e.g. allreduce.json,
    so that ``--output`` may name it anything): the picture too, if matplotlib is installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("(no plot: matplotlib is not installed; pip install -e '.[bench]', then benchmarks/plot.py)")
        return
    print(f"PNG: {plot_file(path, path.parent, kind)}")  # beside the JSON; plot.py's default is benchmarks/plots/


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="*", type=Path, help="JSON results (default: those in benchmarks/results/)")
    parser.add_argument("--out", type=Path, default=PLOTS_DIR, help="where the PNGs go (default: benchmarks/plots/)")
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("benchmarks/plot.py needs matplotlib, which is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 1
    paths = args.results or [RESULTS_DIR / name for name in PLOTTERS if (RESULTS_DIR / name).exists()]
    if not paths:
        print(f"no results in {RESULTS_DIR}: run a benchmark first", file=sys.stderr)
        return 1
    for path in paths:
        print(plot_file(path, args.out))
        keep_beside(path, args.out)
    return 0


def keep_beside(path: Path, out: Path) -> None:
    """A copy of the result beside its picture (without the raw samples), so it can be drawn again."""
    if path.resolve().parent == out.resolve():
        return
    report = json.loads(path.read_text())
    report.pop("samples", None)  # allreduce.json's per-iteration times: megabytes, and no picture uses them
    (out / path.name).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
