"""``--plot``: the per-step rates of each tier and the jobs table as one PNG, with matplotlib when installed.

Plots are drawn from the JSON document alone (:func:`plot_document`), so a saved result can be
plotted again later: ``python -m dlstore.bench.plot results.json out.png``.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, Optional

from dlstore import _console

__all__ = ["MatplotlibMissing", "load_document", "plot_document", "main"]


class MatplotlibMissing(ImportError):
    """matplotlib is not installed; the message says how to get it."""


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise MatplotlibMissing("plotting needs matplotlib, which is not installed: pip install matplotlib "
                                "(or pip install 'dlstore[bench]'); the tables and the JSON are complete "
                                "without it") from None
    matplotlib.use("Agg")  # files only: never open a window, work without a display
    import matplotlib.pyplot as plt

    return plt


def plot_document(doc: Dict[str, Any], path: str) -> str:
    """Writes a PNG of ``doc`` (what ``--json`` writes) to ``path`` (``.png`` added to a name without a
    format's suffix); returns the path written.

    Left: rate per step, one line per tier (the paper's table as a chart). Right, with a jobs
    table: aggregate and per-job rate against the number of concurrent jobs.

    Raises
    ------
    MatplotlibMissing
        When matplotlib is not installed.
    """
    plt = _pyplot()
    unit = doc.get("unit", "images")
    jobs: Optional[Dict[str, Any]] = doc.get("jobs")
    panels = 2 if jobs and jobs.get("rows") else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.2), squeeze=False)
    ax = axes[0][0]
    for tier in doc["tiers"]:
        rates: List[Optional[float]] = tier["steps"]
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=f"{tier['tier']} ({tier['io']})")
    compute = doc.get("compute")
    if compute:
        ax.axhline(compute["samples_per_s_per_accelerator"], color="grey", linestyle="--",
                   label=f"1 accelerator needs ({compute.get('name', 'emulated')})")
    ax.set_xlabel("step")
    ax.set_ylabel(f"{unit}/s")
    ax.set_title(f"{doc['benchmark']}: {unit}/s per step")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    if panels == 2:
        ax = axes[0][1]
        rows = jobs["rows"]
        n = [r["jobs"] for r in rows]
        ax.plot(n, [r["rate"] for r in rows], marker="o", label="aggregate")
        ax.plot(n, [r["per_job_rate_mean"] for r in rows], marker="s", label="per job (mean)")
        ax.set_xlabel("concurrent jobs")
        ax.set_ylabel(f"{unit}/s")
        ax.set_title(f"jobs ({jobs.get('tier', '')})")
        ax.set_xticks(n)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()
    info = doc.get("sysinfo", {})
    fig.suptitle(f"dlstore.bench {doc['benchmark']} on {info.get('cpu', '?')}, {info.get('cores', '?')} cores",
                 fontsize=9)
    fig.tight_layout()
    if not os.path.splitext(os.fspath(path))[1]:
        path = f"{os.fspath(path)}.png"  # what matplotlib writes for a name without a format: say that name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def load_document(path: str) -> Dict[str, Any]:
    """A result written by ``python -m dlstore.bench resnet50|bert --json``, checked to be one.

    Raises
    ------
    ValueError
        When ``path`` is not JSON, or not such a result (a storage result has no per-step rates).
    OSError
        When it cannot be read.
    """
    with open(path) as f:
        try:
            doc = json.load(f)
        except ValueError as e:
            raise ValueError(f"{path}: not JSON ({e})") from None
    tiers = doc.get("tiers") if isinstance(doc, dict) else None
    if not (isinstance(tiers, list) and "benchmark" in doc
            and all(isinstance(t, dict) and {"tier", "io", "steps"} <= set(t) for t in tiers)):
        raise ValueError(f"{path}: not a result of 'python -m dlstore.bench resnet50' or 'bert' written with "
                         f"--json (no per-step rates to plot)")
    return doc


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m dlstore.bench.plot RESULTS.json OUT.png``."""

    parser = _console.Parser(prog="python -m dlstore.bench.plot",
                             description="The per-step rates of a saved bench result as one PNG.")
    parser.add_argument("results", metavar="RESULTS.json",
                        help="what 'python -m dlstore.bench resnet50|bert --json' wrote")
    parser.add_argument("out", metavar="OUT.png", help="the PNG to write (.png added to a name without a suffix)")
    args = parser.parse_args(argv)

    def plot() -> int:
        doc = load_document(args.results)
        try:
            print(f"wrote {plot_document(doc, args.out)}")
        except MatplotlibMissing as e:
            print(f"python -m dlstore.bench.plot: {e}", file=sys.stderr)
            return 2
        return 0

    return _console.run("python -m dlstore.bench.plot", plot)


if __name__ == "__main__":
    sys.exit(main())
