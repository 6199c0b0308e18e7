"""The pipeline benchmark's document (the JSON) and its tables, text and markdown, with the verdict."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from dlstore.bench import report
from dlstore.bench.compute import AU_THRESHOLD_PCT, Compute
from dlstore.bench.tiers import Workload

__all__ = ["build_document", "tier_entry", "step_table", "tier_table", "jobs_table", "format_report",
           "markdown_report"]


def tier_entry(t: Dict[str, Any], rate_key: str, compute: Optional[Compute], batch_size: int,
                accelerators: int = 1) -> Dict[str, Any]:
    """A tier as the JSON holds it: the agreed keys first, then the details."""
    entry = {
        "tier": t["tier"],
        "io": t["io"],
        rate_key: t["rate"],
        "mb_per_s": t["mb_per_s"],
        "steps": [s["rate"] for s in t["steps"]],
        "cpu_busiest_core_pct": t["busiest_core_pct"],
    }
    entry.update({k: v for k, v in t.items() if k not in ("rate", "busiest_core_pct", "steps")})
    entry["step_details"] = t["steps"]
    # Storage's bytes per sample: of every record the source delivered (the steps' bytes count records
    # read ahead that their samples do not, which doubled the figure on a short run).
    if t.get("read_records"):
        entry["bytes_per_sample"] = t["read_bytes"] / t["read_records"]
    else:
        entry["bytes_per_sample"] = t["bytes"] / t["samples"] if t["samples"] else None
    if compute is not None:
        need = compute.samples_per_s(batch_size)
        entry["required_mb_per_s_per_accelerator"] = (need * entry["bytes_per_sample"] / 1e6
                                                      if entry["bytes_per_sample"] else None)
        entry["sustained_pct"] = 100.0 * t["rate"] / (accelerators * need) if t["rate"] else None
    return entry


def build_document(workload: Workload, tiers: Sequence[Dict[str, Any]], *, info: Dict[str, Any],
                   config: Dict[str, Any], compute: Optional[Compute], batch_size: int,
                   jobs: Optional[Dict[str, Any]] = None, ranks: Optional[List[List[Dict[str, Any]]]] = None,
                   notes: Sequence[str] = (), warnings: Sequence[str] = ()) -> Dict[str, Any]:
    """The JSON document: ``benchmark``, ``unit``, ``sysinfo`` (the header), ``config``, ``tiers``
    (per tier ``tier``, ``io``, ``<unit>_per_s``, ``mb_per_s``, ``steps``, ``cpu_busiest_core_pct``
    and details), ``jobs``, ``compute``, ``verdict``, ``notes``, ``warnings`` (why a figure may not
    be trusted: :func:`dlstore.bench.sysinfo.trust_warnings`); under MPI ``ranks`` (each rank's
    tiers) and the tiers are the aggregate."""
    world = len(ranks) if ranks else 1
    doc: Dict[str, Any] = {
        "benchmark": workload.name,
        "unit": workload.unit,
        "sysinfo": info,
        "config": dict(config, batch_size=batch_size),
        "tiers": [tier_entry(t, workload.rate_key, compute, batch_size, world) for t in tiers],
        "jobs": jobs,
        "compute": None if compute is None else {
            "name": compute.name, "seconds_per_batch": compute.seconds_per_batch, "label": compute.label,
            "source": compute.source,
            "samples_per_s_per_accelerator": compute.samples_per_s(batch_size)},
        "notes": list(notes),
        "warnings": list(warnings),
    }
    if ranks:
        doc["world_size"] = world
        doc["ranks"] = [[tier_entry(t, workload.rate_key, compute, batch_size) for t in r] for r in ranks]
    doc["verdict"] = _verdict(doc, workload, compute, batch_size, world)
    return doc


def _verdict(doc: Dict[str, Any], workload: Workload, compute: Optional[Compute], batch_size: int,
             world: int) -> List[str]:
    """Lines naming what the storage sustains, against the emulated accelerators when there are some."""
    key = workload.rate_key
    unit = workload.unit
    by_name = {t["tier"]: t for t in doc["tiers"]}
    lines = []
    base = by_name.get("page-cache")
    for name in ("local-cold", "target"):
        t = by_name.get(name)
        if t is not None and base is not None and t[key] and base[key]:
            lines.append(f"{name}: {t[key]:,.0f} {unit}/s = {100 * t[key] / base[key]:.0f}% of the page-cache tier "
                         f"({base[key]:,.0f} {unit}/s)")
    if compute is None:
        lines.append("no accelerator emulated: add --compute a100 (or h100, or ms per batch) for accelerator "
                     "utilisation and the MB/s each accelerator needs")
        return lines
    need = compute.samples_per_s(batch_size)
    judged = by_name.get("target") or by_name.get("local-cold") or (doc["tiers"][0] if doc["tiers"] else None)
    if judged is not None and judged.get("sustained_pct") is not None:
        au = judged.get("accelerator_util_pct")
        req = judged.get("required_mb_per_s_per_accelerator")
        acc = f"{world} accelerators ({compute.name}) need" if world > 1 else f"1 accelerator ({compute.name}) needs"
        au_text = "-" if au is None else f"{au:.0f}%"
        meets = "meets" if au is not None and au >= AU_THRESHOLD_PCT else "below"
        req_text = "-" if req is None else f"{req:,.1f}"
        reading = judged.get("read_share_pct")
        # Storage is the bottleneck only where the loader waits on reads most of its time; else its cores are
        # (decoding, parsing), and faster storage would not raise the figure.
        who = ("storage" if reading is None or reading >= 50 else
               f"the input pipeline (CPU-bound: it waits for records {reading:.0f}% of its time, so faster storage "
               f"would not help)")
        lines.append(f"{judged['tier']}: {who} sustains {judged['sustained_pct']:.0f}% of what {acc}: "
                     f"{judged[key]:,.0f} of {world * need:,.0f} {unit}/s; "
                     f"accelerator utilisation {au_text} ({meets} MLPerf Storage's {AU_THRESHOLD_PCT:.0f}%); "
                     f"each accelerator needs {req_text} MB/s")
    jobs = doc.get("jobs")
    if jobs and jobs.get("rows"):
        fed = 0  # the most jobs for which every row up to it kept its accelerators busy enough
        for r in jobs["rows"]:
            if (r.get("accelerator_util_pct") or 0) < AU_THRESHOLD_PCT:
                break
            fed = r["jobs"]
        last = jobs["rows"][-1]
        reach = (f"AU >= {AU_THRESHOLD_PCT:.0f}% with up to {fed} {'job' if fed == 1 else 'jobs'}" if fed else
                 f"AU below {AU_THRESHOLD_PCT:.0f}% already with 1 job")
        lines.append(f"jobs: {last['jobs']} emulated accelerators at once get {last['sustained_pct']:.0f}% of what "
                     f"they need (mean AU {last['accelerator_util_pct']:.0f}%); {reach}")
    return lines


def _rate_fmt(v: float) -> str:
    return f"{v:,.0f}"


def _pct_fmt(v: float) -> str:
    return f"{v:.0f}%"


def step_table(tiers: Sequence[Dict[str, Any]], unit: str) -> Tuple[List[Dict[str, Any]], List[report.Column]]:
    """The per-step table, tiers side by side as the paper's (Step | NVMe | AI400X2), with each tier's busiest core."""
    columns = [report.Column("step", "step", align="<")]
    n = max((len(t["step_details"]) for t in tiers), default=0)
    rows: List[Dict[str, Any]] = [{"step": i + 1} for i in range(n)]
    for t in tiers:
        name = t["tier"]
        columns.append(report.Column(f"{name}:rate", f"{name} {unit}/s", _rate_fmt))
        columns.append(report.Column(f"{name}:mb", "MB/s", "{:,.0f}"))
        columns.append(report.Column(f"{name}:cpu", "core%", "{:.0f}"))
        if any(s.get("accelerator_util_pct") is not None for s in t["step_details"]):
            columns.append(report.Column(f"{name}:au", "AU", _pct_fmt))
        for i, s in enumerate(t["step_details"]):
            rows[i].update({f"{name}:rate": s["rate"], f"{name}:mb": s["mb_per_s"],
                            f"{name}:cpu": s["busiest_core_pct"], f"{name}:au": s.get("accelerator_util_pct")})
    return rows, columns


def tier_table(tiers: Sequence[Dict[str, Any]], rate_key: str, unit: str) -> Tuple[List[Dict], List[report.Column]]:
    """One summary row per tier."""
    columns = [
        report.Column("tier", "tier", align="<"),
        report.Column("io", "io", align="<"),
        report.Column(rate_key, f"{unit}/s", _rate_fmt),
        report.Column("mb_per_s", "MB/s", "{:,.1f}"),
        report.Column("cpu_busiest_core_pct", "busiest core", _pct_fmt),
        report.Column("process_cpu_pct", "process CPU", _pct_fmt),
        report.Column("seconds", "seconds", "{:.2f}"),
        report.Column("cached_before", "cached before", lambda v: f"{100 * v:.0f}%"),
        report.Column("read_share_pct", "reading", _pct_fmt),
    ]
    if any(t.get("accelerator_util_pct") is not None for t in tiers):
        columns += [report.Column("accelerator_util_pct", "AU", _pct_fmt),
                    report.Column("sustained_pct", "sustains", _pct_fmt),
                    report.Column("required_mb_per_s_per_accelerator", "needed MB/s per accel.", "{:,.1f}")]
    return list(tiers), columns


def jobs_table(jobs: Dict[str, Any], unit: str) -> Tuple[List[Dict], List[report.Column]]:
    """One row per number of concurrent jobs."""
    columns = [
        report.Column("jobs", "jobs", align="<"),
        report.Column("rate", f"aggregate {unit}/s", _rate_fmt),
        report.Column("per_job_rate_mean", f"per job {unit}/s", _rate_fmt),
        report.Column("per_job_rate_min", "slowest job", _rate_fmt),
        report.Column("mb_per_s", "MB/s", "{:,.1f}"),
        report.Column("busiest_core_pct", "busiest core", _pct_fmt),
    ]
    if any(r.get("accelerator_util_pct") is not None for r in jobs["rows"]):
        columns += [report.Column("accelerator_util_pct", "AU", _pct_fmt),
                    report.Column("sustained_pct", "sustains", _pct_fmt)]
    return jobs["rows"], columns


def _sections(doc: Dict[str, Any]) -> List[Tuple[str, Tuple[List[Dict], List[report.Column]]]]:
    unit = doc["unit"]
    rate_key = f"{unit}_per_s"
    per = "all ranks, " if doc.get("ranks") else ""
    out = [(f"{unit}/s per step ({per}a step = {doc['config']['step_batches_text']})", step_table(doc["tiers"], unit)),
           ("tiers", tier_table(doc["tiers"], rate_key, unit))]
    for r, tiers in enumerate(doc.get("ranks") or []):
        out.append((f"rank {r}: {unit}/s per step", step_table(tiers, unit)))
    if doc.get("jobs"):
        j = doc["jobs"]
        out.append((f"concurrent jobs ({j['shards']}; each runs {j['steps_per_job']} "
                    f"{'step' if j['steps_per_job'] == 1 else 'steps'}, {j['batches_per_job']} "
                    f"{'batch' if j['batches_per_job'] == 1 else 'batches'}; "
                    f"cache: {j['cache_method']})", jobs_table(j, unit)))
    return out


def format_report(doc: Dict[str, Any]) -> str:
    """The tables and the verdict as terminal text."""
    lines = []
    for title, (rows, columns) in _sections(doc):
        lines += [report.text_table(rows, columns, title=title), ""]
    for t in doc["tiers"]:
        mounts = ((t.get("loader_stats") or {}).get("source") or {}).get("mounts")
        lines.append(f"{t['tier']:<10} io={t['io']} ({t['io_reason']}); cache: {t['cache_method']}"
                     + (f"; read through {', '.join(mounts)}" if mounts else ""))
    every = list(doc["tiers"]) + [t for r in doc.get("ranks") or [] for t in r]  # under MPI the ranks' tiers say
    decoders = {(t.get("loader_stats") or {}).get("decoder") for t in every} - {None}
    for d in sorted(decoders):
        lines.append(f"decoder: {d}")
    if any(t.get("read_share_pct") is not None for t in doc["tiers"]):
        lines.append("reading: the loader's time waiting for records, as a share of its time reading + decoding "
                     "(near 100%: storage-bound; near 0%: CPU-bound)")
    for note in doc["notes"]:
        lines.append(f"note: {note}")
    if doc.get("compute"):
        c = doc["compute"]
        lines.append(f"accelerator emulated: {c['label']}; source: {c['source']}")
    lines += [""] + [f"verdict: {v}" for v in doc["verdict"]]
    lines += [f"warning: {w}" for w in doc.get("warnings", [])]
    return "\n".join(lines)


def markdown_report(doc: Dict[str, Any]) -> str:
    """The same tables as markdown, with the header's facts and the verdict."""
    info = doc["sysinfo"]
    out = [f"## dlstore.bench {doc['benchmark']}", "",
           f"{info.get('cpu')}, {info.get('cores')} cores; {info.get('kernel')}; data on {info.get('filesystem', '?')}",
           ""]
    for title, (rows, columns) in _sections(doc):
        out += [f"**{title}**", "", report.markdown_table(rows, columns)]
    out += [f"- {v}" for v in doc["verdict"]]
    out += [f"- warning: {w}" for w in doc.get("warnings", [])]
    return "\n".join(out) + "\n"
