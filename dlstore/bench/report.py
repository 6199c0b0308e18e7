"""Presenting benchmark results: aligned terminal tables, markdown tables, JSON, and the summary
statistics of repeated runs.

A table is a list of row dicts and a list of :class:`Column` s; a missing or ``None`` value prints
as ``-`` so skipped peers keep their row.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

from dlstore.io.system import existing_parent, format_bytes

__all__ = ["Column", "format_cell", "text_table", "markdown_table", "write_json", "summarize", "fmt_ratio",
           "fmt_bytes"]


@dataclass(frozen=True)
class Column:
    """One column: the row key, its header, and how to format a value (a format spec or a function)."""

    key: str
    header: str
    fmt: Union[str, Callable[[Any], str]] = "{}"
    align: str = ">"  # ">" numbers, "<" text


def format_cell(value: Any, column: Column) -> str:
    """A value as text; ``None`` and NaN print as ``-``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if callable(column.fmt):
        return column.fmt(value)
    return column.fmt.format(value)


#: Bytes in decimal units, as storage is sized (``3.08 GB``, ``29.3 MB``): the one formatter of sizes.
fmt_bytes = format_bytes


def fmt_ratio(value: float) -> str:
    """A ratio as ``0.97x``."""
    return f"{value:.2f}x"


def _cells(rows: Sequence[Dict[str, Any]], columns: Sequence[Column]) -> List[List[str]]:
    return [[format_cell(row.get(c.key), c) for c in columns] for row in rows]


def text_table(rows: Sequence[Dict[str, Any]], columns: Sequence[Column], title: Optional[str] = None) -> str:
    """An aligned plain-text table with a rule under the header."""
    body = _cells(rows, columns)
    widths = [max([len(c.header)] + [len(r[i]) for r in body]) for i, c in enumerate(columns)]

    def line(cells: Iterable[str]) -> str:
        return "  ".join(f"{cell:{c.align}{w}}" for cell, c, w in zip(cells, columns, widths)).rstrip()

    out = [title] if title else []
    out.append(line(c.header for c in columns))
    out.append("  ".join("-" * w for w in widths))
    out += [line(r) for r in body]
    return "\n".join(out)


def markdown_table(rows: Sequence[Dict[str, Any]], columns: Sequence[Column]) -> str:
    """A GitHub-flavoured markdown table (numbers right-aligned)."""
    body = _cells(rows, columns)

    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    out = ["| " + " | ".join(esc(c.header) for c in columns) + " |",
           "|" + "|".join("---:" if c.align == ">" else ":---" for c in columns) + "|"]
    out += ["| " + " | ".join(esc(cell) for cell in r) + " |" for r in body]
    return "\n".join(out) + "\n"


def _jsonable(value: Any) -> Any:
    # numpy scalars and arrays, paths and dataclasses reach the JSON writer from result dicts.
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def write_json(path: str, data: Any) -> str:
    """Writes ``data`` as indented JSON, creating parent directories; returns the path."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, default=_jsonable)
        f.write("\n")
    os.replace(tmp, path)  # a reader of the results never sees half a file
    return path


def check_output_path(option: str, path: Optional[str]) -> None:
    """Raises a ValueError (one line, exit 2) now, before a run, when ``path`` cannot take a file: a directory,
    or under a directory that cannot be written. Found only after the run, the run was lost."""
    if not path:
        return
    if os.path.isdir(path):
        raise ValueError(f"{option} {path} is a directory: give a file name")
    where = existing_parent(os.path.dirname(os.path.abspath(path)))
    if not os.access(where, os.W_OK):
        raise ValueError(f"{option} {path}: {where} cannot be written")


def write_outputs(doc: Any, json_path: Optional[str], markdown_path: Optional[str],
                  markdown: Callable[[], str]) -> None:
    """A bench run's files, each where its option asked (``--json``, ``--markdown``), saying where."""
    if json_path:
        write_json(json_path, doc)
        print(f"\nwrote {json_path}")
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(markdown())
        print(f"wrote {markdown_path}")


def summarize(values: Sequence[float]) -> Dict[str, Optional[float]]:
    """Median and spread of repeated measurements: ``median``, ``min``, ``max``, ``spread_pct``
    (``(max - min) / median`` in percent) and ``n``."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "spread_pct": None, "n": 0}
    med = statistics.median(vals)
    lo, hi = min(vals), max(vals)
    return {"median": med, "min": lo, "max": hi, "spread_pct": (100.0 * (hi - lo) / med) if med else None,
            "n": len(vals)}
