"""What the side-by-side benchmarks share: each contender measured in a fresh interpreter that prints one
JSON result line, the frameworks' versions it imported, and the JSON + markdown outputs."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Module imported by a worker -> the distribution that provides it (for modules without __version__).
_FRAMEWORKS = (("tensorflow", "tensorflow"), ("nvidia.dali", "nvidia-dali-cuda130"), ("torch", "torch"),
               ("tfrecord", "tfrecord"), ("PIL", "pillow"))


def framework_versions() -> Dict[str, str]:
    """Versions of the frameworks this process imported, for the report."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for module, dist in _FRAMEWORKS:
        if module in sys.modules:
            v = getattr(sys.modules[module], "__version__", None)
            if v is None:  # the tfrecord package has no __version__
                try:
                    v = version(dist)
                except PackageNotFoundError:
                    v = "?"
            out[module] = str(v)
    return out


def module_missing(module: str, install: str) -> Optional[str]:
    """Why ``module`` cannot be imported here (``"X is not installed (how)"``), found without importing it."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"{module} is not installed ({install})"


def median(values: Sequence[Optional[float]]) -> Optional[float]:
    """The median of the measured values (None ones are left out; None when there are none)."""
    from dlstore.bench import report

    return report.summarize(values)["median"]


def run_worker(script: str, args: Sequence[str], result_prefix: str, timeout: float) -> Dict:
    """Runs ``script args`` in a fresh interpreter; returns the JSON after ``result_prefix`` on its last
    such stdout line, or ``{"error": why}`` (a timeout, or the exit status and the last lines it printed).

    Each contender gets its own process so that one framework's threads and memory do not disturb
    another, and the ``tfrecord`` package never shares a process with TensorFlow.
    """
    cmd = [sys.executable, os.path.abspath(script), *args]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", DLSTORE_NO_PROGRESS="1",
               PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(result_prefix):
            return json.loads(line[len(result_prefix):])
    tail = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()][-3:]
    return {"error": f"worker exited with {proc.returncode}: " + " | ".join(tail)[-400:]}


def cold_fio_refusal() -> Optional[str]:
    """Why cold runs beside fio cannot run here (dropping the page cache needs root; fio must be
    installed), or None."""
    from dlstore.bench.fio import fio_missing_reason
    from dlstore.io.pagecache import drop_page_cache_refusal

    return drop_page_cache_refusal() or fio_missing_reason()


def cold_set_or_refusal(name: str, data: Optional[str], size: str):
    """What a cold script beside fio reads: ``(paths, glob)`` of ``data`` (a glob, directory or file;
    default: the cached generated ImageNet-like set of preset ``size``), or ``None`` after printing, on
    stderr, why it cannot run here (the caller exits 2)."""
    from dlstore.bench.storage import dataset_paths

    why = cold_fio_refusal()
    if why:
        print(f"{name} needs root (to drop the page cache) and fio: {why}", file=sys.stderr)
        return None
    paths = dataset_paths(data, size)
    return paths, data or os.path.join(os.path.dirname(paths[0]), "*")


def cold_fio_rate(paths: Sequence[str], **fio: Any) -> float:
    """GB/s of one fio run over ``paths`` from a dropped page cache (:func:`dlstore.bench.fio.run_fio`'s
    keywords: ``jobs``, ``bs``, ``ioengine``, ``iodepth``...)."""
    from dlstore.bench.fio import run_fio
    from dlstore.io.pagecache import drop_page_cache

    drop_page_cache()
    return run_fio(paths, **fio).gb_per_s


def cold_dataset_row(data: str, engine: str, shuffle: str, *, verify: bool = True, batch_size: Optional[int] = None,
                     settings: Optional[Mapping[str, str]] = None) -> Dict:
    """One cold ``benchmarks/shuffles.py`` row (a fresh interpreter: an untimed epoch, the page cache
    dropped, one timed epoch; no fio) for ``data`` (a glob), with ``settings`` (``DLSTORE_*`` environment
    variables, as a user sets them) in its environment: the row's dict, or ``{"error": why}``."""
    import tempfile

    script = os.path.join(ROOT, "benchmarks", "shuffles.py")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "row.json")
        cmd = [sys.executable, script, "--data", data, "--cache", "cold", "--engines", engine, "--shuffles", shuffle,
               "--no-fio", "--repeat", "1", "--quiet", "--json", out]
        cmd += ([] if verify else ["--no-verify"]) + ([] if batch_size is None else ["--batch-size", str(batch_size)])
        p = subprocess.run(cmd, env=dict(os.environ, **(settings or {})), capture_output=True, text=True, timeout=900)
        if p.returncode != 0 or not os.path.exists(out):
            return {"error": (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]}
        with open(out) as f:
            return json.load(f)["rows"][0]


def add_output_arguments(p, name: str) -> None:
    """``--json FILE`` and ``--save``: where a script's results JSON goes (:func:`results_path`)."""
    p.add_argument("--json", metavar="FILE",
                   help=f"results JSON (default: benchmarks/results/{name}-latest.json, or {name}-quick.json "
                        "with --quick; git ignores both)")
    p.add_argument("--save", action="store_true",
                   help=f"write the committed benchmarks/results/{name}.json, the figures the docs quote")


def results_path(name: str, *, json_path: Optional[str] = None, save: bool = False, quick: bool = False) -> str:
    """Where a run's results JSON goes: ``json_path`` when given; with ``save`` the committed
    ``benchmarks/results/<name>.json``; else ``<name>-latest.json`` (``<name>-quick.json`` for a
    quick run) beside it, which git ignores, so that an ordinary run never overwrites the committed
    figures. Call it before measuring: a refused combination then costs nothing.

    Raises
    ------
    ValueError
        For ``save`` with ``quick`` (a smoke test is not the figures the docs quote) or with ``json_path``.
    """
    if save and quick:
        raise ValueError("--save writes the committed results: a --quick run is a smoke test, not those")
    if save and json_path:
        raise ValueError("--save and --json name two places for one result: give one")
    if json_path:
        return json_path
    suffix = "" if save else "-quick" if quick else "-latest"
    return os.path.join(ROOT, "benchmarks", "results", f"{name}{suffix}.json")


def add_page_arguments(p) -> None:
    """``--markdown FILE`` and ``--render JSON``: the docs page a script writes, and rewriting it from an
    earlier run's JSON without measuring."""
    p.add_argument("--markdown", help="also write the markdown page here")
    p.add_argument("--render", metavar="JSON", help="write --markdown from an earlier run's JSON, measuring nothing")


def parse(p, name: str, argv=None):
    """``p.parse_args(argv)`` and the results path of those arguments (:func:`output_path`)."""
    args = p.parse_args(argv)
    return args, output_path(p, args, name)


def output_path(p, args, name: str) -> str:
    """:func:`results_path` for a script's parsed ``args`` (``--json``, ``--save``, ``--quick`` where the
    script has it); a refused combination is ``p``'s usage error (exit 2)."""
    try:
        return results_path(name, json_path=args.json, save=args.save, quick=getattr(args, "quick", False))
    except ValueError as e:
        p.error(str(e))


def write_outputs(doc: Dict, json_path: str, markdown_path: Optional[str], markdown: Callable[[Dict], str]) -> None:
    """Writes ``doc`` as JSON to ``json_path`` (:func:`results_path`) and, when asked, its markdown
    page; prints where."""
    from dlstore.bench import report

    path = json_path
    report.write_json(path, doc)
    print(f"\nwrote {path}")
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(markdown(doc))
        print(f"wrote {markdown_path}")


def render(json_path: str, markdown_path: Optional[str], markdown: Callable[[Dict], str]) -> int:
    """``--render JSON``: writes the markdown page of an earlier run from its JSON alone, measuring nothing.
    Returns the exit status (2 without ``--markdown``)."""
    if not markdown_path:
        print("--render needs --markdown FILE", file=sys.stderr)
        return 2
    with open(json_path) as f:
        doc = json.load(f)
    with open(markdown_path, "w") as f:
        f.write(markdown(doc))
    print(f"wrote {markdown_path} from {json_path}")
    return 0


def select(only: Optional[str], contenders: Mapping[str, Any], groups: Sequence[str] = ("family",)) -> List[str]:
    """Contender names from ``--only``: names, or values of the contenders' ``groups`` attributes
    (a family such as ``dali``, a task such as ``bert``), in table order.

    Raises
    ------
    ValueError
        Naming what is unknown, and what is known.
    """
    if not only:
        return list(contenders)
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    known = {g: sorted({getattr(c, g) for c in contenders.values()}) for g in groups}
    unknown = [w for w in wanted if w not in contenders and not any(w in v for v in known.values())]
    if unknown:
        kinds = "; ".join(f"{g}: {', '.join(v)}" for g, v in known.items())
        raise ValueError(f"--only: unknown {', '.join(unknown)}; contenders: {', '.join(contenders)}; {kinds}")
    return [n for n, c in contenders.items() if n in wanted or any(getattr(c, g) in wanted for g in groups)]
