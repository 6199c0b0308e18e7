"""What ``benchmarks/pipelines.py`` makes of its measurements: each task's table (medians over rounds,
the output check, ratios to the peers), issue 8's targets with their verdicts, and the text around
them: the columns, what every contender does alike and where their semantics differ, and the
markdown page (docs/pipelines.md).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from benchmarks import _harness
from benchmarks.contenders.spec import (
    AREA_RANGE,
    CONTENDERS,
    CROP_ATTEMPTS,
    FAMILY_LABELS,
    MEAN,
    STD,
    TASKS,
    expected_spec,
)
from dlstore.bench import report

__all__ = ["task_rows", "add_ratios", "targets", "columns", "TARGET_COLUMNS", "plan_line", "markdown_doc"]


def task_rows(task: str, selected: Sequence[str], results: Dict[str, Dict], plan: Dict) -> List[Dict]:
    """One task's table: a row per selected contender (measured, skipped or failed), with ratios."""
    rows = []
    for name in (n for n in selected if CONTENDERS[n].task == task):
        c, res = CONTENDERS[name], results.get(name, {})
        row: Dict = {"name": name, "contender": c.label, "family": c.family, "crc": c.crc,
                     "shuffle": c.dlstore_shuffle or f"buffer {plan['shuffle_buffer']:,}"}
        if "skipped" in res:
            rows.append(dict(row, status=res["skipped"]))
            continue
        if "error" in res:
            rows.append(dict(row, status=f"failed: {res['error']}"))
            continue
        runs = res["runs"]
        for key in ("items_per_s", "cpu_ms_per_item", "busiest_core_pct", "others_cpu_pct", "startup_seconds",
                    "cached_before"):
            row[key] = _harness.median([r.get(key) for r in runs])
        row["rss_mb"] = _harness.median([r["rss_bytes"] / 1e6 for r in runs])
        spread = report.summarize([r["items_per_s"] for r in runs])["spread_pct"]
        row["spread_pct"] = spread if len(runs) > 1 else None
        spec = runs[0]["spec"]
        row["spec"] = spec
        key = "image" if task == "resnet50" else "input_ids"
        shape, dtype = spec.get(key, [[], "?"])
        row["output"] = f"{dtype} {'x'.join(str(d) for d in shape)}"
        expected = expected_spec(dict(plan, family=c.family))
        wrong = sorted(k for k in expected if spec.get(k) != expected[k])
        row["status"] = "ok" if not wrong else "wrong output: " + "; ".join(
            f"{k} {spec.get(k)} (expected {expected[k]})" for k in wrong)
        if res.get("round_errors"):
            row["status"] += f" ({len(res['round_errors'])} round(s) failed: {res['round_errors'][0]})"
        if "loader_stats" in runs[-1]:
            stats = row["loader_stats"] = runs[-1]["loader_stats"]
            row["how"] = "; ".join(f"{k} {stats[k]}" for k in ("engine", "threads", "decoder", "parser", "shuffle")
                                   if stats.get(k) is not None)
        row["runs"] = runs
        rows.append(row)
    add_ratios(rows)
    unit = TASKS[task]["unit"]
    for row in rows:  # the JSON names: images_per_s / samples_per_s
        if "items_per_s" in row:
            row[f"{unit}_per_s"] = row["items_per_s"]
    return rows


def add_ratios(rows: List[Dict]) -> None:
    """``vs_dali``, ``vs_tfdata`` and ``vs_torch``: items/s over that (shuffled) peer's items/s, same task;
    ``vs_none``: a dlstore row over dlstore's unshuffled row."""
    ok = [r for r in rows if r.get("items_per_s") and str(r.get("status", "")).startswith("ok")]
    base = {r["family"]: r["items_per_s"] for r in ok if r["family"] != "dlstore"}
    for r in ok:
        if r["family"] == "dlstore" and r.get("shuffle") == "none":
            base["none"] = r["items_per_s"]
    for r in rows:
        if not r.get("items_per_s"):
            continue
        for family in FAMILY_LABELS:
            if base.get(family):
                r[f"vs_{family}"] = r["items_per_s"] / base[family]
        if r["family"] == "dlstore" and base.get("none"):
            r["vs_none"] = r["items_per_s"] / base["none"]


# Issue 8's targets: dlstore's global shuffle against its own unshuffled read and the shuffled peers.
BERT_GLOBAL_VS_DALI = 3.0       # samples/s >= this x DALI readers.tfrecord (random_shuffle)
BERT_GLOBAL_VS_NONE = 0.8       # samples/s >= this x dlstore unshuffled
RESNET50_GLOBAL_VS_NONE = 0.95  # images/s >= this x dlstore unshuffled
RESNET50_GLOBAL_VS_DALI = 1.5   # images/s >= this x DALI CPU (random_shuffle)
RESNET50_GLOBAL_VS_TFDATA = 1.2  # images/s >= this x tf.data (.shuffle(N))


def targets(tables: Dict[str, List[Dict]]) -> List[Dict]:
    """Issue 8's targets (shuffled), each with the measured ratio and PASS, FAIL or SKIP (why)."""
    def rate(task: str, family: str, shuffle: Optional[str] = None) -> Optional[float]:
        for r in tables.get(task, []):
            if r["family"] == family and (shuffle is None or r.get("shuffle") == shuffle) \
                    and str(r.get("status", "")).startswith("ok"):
                return r.get("items_per_s")
        return None

    def verdict(target: str, mine: Optional[float], peer: Optional[float], peer_name: str, factor: float) -> Dict:
        if mine is None or not peer:
            missing = (["dlstore global"] if mine is None else []) + ([peer_name] if not peer else [])
            return {"target": target, "value": None, "text": "-",
                    "verdict": f"SKIP ({', '.join(missing)} not measured)"}
        ratio = mine / peer
        return {"target": target, "value": ratio, "text": f"{ratio:.2f}x {peer_name}",
                "verdict": "PASS" if ratio >= factor else "FAIL"}

    out = []
    if "bert" in tables:
        mine = rate("bert", "dlstore", "global")
        out.append(verdict(f"bert: dlstore global >= {BERT_GLOBAL_VS_DALI:g} x DALI (shuffled) samples/s", mine,
                           rate("bert", "dali"), "DALI", BERT_GLOBAL_VS_DALI))
        out.append(verdict(f"bert: dlstore global >= {BERT_GLOBAL_VS_NONE:g} x dlstore unshuffled", mine,
                           rate("bert", "dlstore", "none"), "dlstore none", BERT_GLOBAL_VS_NONE))
    if "resnet50" in tables:
        mine = rate("resnet50", "dlstore", "global")
        out.append(verdict(f"resnet50: dlstore global >= {RESNET50_GLOBAL_VS_NONE:g} x dlstore unshuffled", mine,
                           rate("resnet50", "dlstore", "none"), "dlstore none", RESNET50_GLOBAL_VS_NONE))
        out.append(verdict(f"resnet50: dlstore global >= {RESNET50_GLOBAL_VS_DALI:g} x DALI CPU (shuffled)", mine,
                           rate("resnet50", "dali"), "DALI", RESNET50_GLOBAL_VS_DALI))
        out.append(verdict(f"resnet50: dlstore global >= {RESNET50_GLOBAL_VS_TFDATA:g} x tf.data .shuffle(N)",
                           mine, rate("resnet50", "tfdata"), "tf.data", RESNET50_GLOBAL_VS_TFDATA))
    return out


def columns(task: str) -> List[report.Column]:
    unit = TASKS[task]["unit"]
    cols = [
        report.Column("contender", "contender", align="<"),
        report.Column("shuffle", "shuffle", align="<"),
        report.Column("output", "output", align="<"),
        report.Column("crc", "CRC", lambda v: "yes" if v else "no", align="<"),
        report.Column("items_per_s", f"{unit}/s", "{:,.0f}"),
        report.Column("cpu_ms_per_item", f"CPU ms/{unit[:-1]}", "{:.3f}" if task == "resnet50" else "{:.4f}"),
    ]
    families = ("dali", "tfdata", "torch") if task == "resnet50" else ("dali", "tfdata")
    cols += [report.Column(f"vs_{f}", f"vs {FAMILY_LABELS[f]}", report.fmt_ratio) for f in families]
    cols += [report.Column("vs_none", "vs dlstore none", report.fmt_ratio)]
    cols += [
        report.Column("spread_pct", "spread", lambda v: f"{v:.0f}%"),
        report.Column("busiest_core_pct", "busiest core", lambda v: f"{v:.0f}%"),
        report.Column("others_cpu_pct", "others", lambda v: f"{v:.0f}%"),
        report.Column("rss_mb", "RSS", lambda v: f"{v:,.0f} MB"),
        report.Column("startup_seconds", "first batch", lambda v: f"{v:.1f} s"),
        report.Column("status", "status", align="<"),
    ]
    return cols


TARGET_COLUMNS = [
    report.Column("target", "target (issue 8: shuffled, warm cache)", align="<"),
    report.Column("text", "measured", align="<"),
    report.Column("verdict", "verdict", align="<"),
]
SEMANTICS_COLUMNS = [
    report.Column("contender", "contender", align="<"),
    report.Column("shuffle", "shuffle", align="<"),
    report.Column("crc", "CRC", lambda v: "yes" if v else "no", align="<"),
    report.Column("decode", "read + decode", align="<"),
    report.Column("resize", "crop, resize, flip, normalise", align="<"),
    report.Column("output", "output", align="<"),
]
SAME_FOR_ALL = [
    ("RandomResizedCrop", f"area {AREA_RANGE[0]:g}..{AREA_RANGE[1]:g} of the image, aspect ratio 3/4..4/3, "
     f"{CROP_ATTEMPTS} attempts; horizontal flip with probability 1/2; with `--output float`, ImageNet mean "
     f"{MEAN} and std {STD} (times 255 on 0..255 pixels)"),
    ("order", "every contender shuffles, as training reads (the `shuffle` column of each table and below): the "
     "peers through a shuffle buffer of `--shuffle-buffer` records, dlstore through `dlstore.Dataset`; dlstore's "
     "`none` row reads unshuffled, the reference its shuffles are compared with (tf.data interleaves as many "
     "files as there are cores)"),
    ("cores", "each contender pinned to the same cores (`sched_setaffinity`, inherited by every thread "
     "and worker process); DALI's `num_threads`, tf.data's private thread pool (AUTOTUNE within it) and "
     "the DataLoader's workers set to that many; dlstore with its default: a decoding thread per core for "
     "ResNet-50, one parsing thread for BERT (at batch 64 a pool costs more in hand-offs than it saves)"),
]
DIFFERENCES = [
    "**Crop sampling.** dlstore, the PIL contender (torchvision's algorithm) and DALI draw the area "
    "fraction uniformly and the aspect ratio log-uniformly. tf.data's `sample_distorted_bounding_box` "
    "draws the ratio uniformly, then the crop height uniformly among those meeting the area range, which "
    "favours small crops: `python benchmarks/crop_area.py` (2,000 draws on a 400 x 400 image) gives a "
    "median crop of 0.38 of the image against 0.47 for RandomResizedCrop. Smaller crops mean fewer rows "
    "to decode and fewer pixels to "
    "resize, so this favours tf.data here. When all 10 draws miss (rare for ImageNet-sized images) dlstore "
    "and torchvision take the whole image clamped to the ratio range, centred; DALI the same at a random "
    "position; tf.data the whole image.",
    "**Decode scale and resize filter.** dlstore decodes the crop at the smallest DCT scale M/8 that "
    "still covers 224 px (1/8, 2/8, 4/8 or 8/8: libjpeg-turbo's scaled IDCT does part of the "
    "downscaling), then resizes the rest with antialiased bilinear, PIL's and torchvision's filter. "
    "DALI and tf.data decode the crop window at full scale; PIL decodes the "
    "whole image at full scale (torchvision does not use Pillow's draft mode). PIL's BILINEAR and DALI's "
    "linear resize are antialiased when scaling down (the filter widens with the scale); "
    "`tf.image.resize` bilinear is not (TF's default, as in TF's official ImageNet input): cheaper, and "
    "aliased on large crops.",
    "**Output.** With `--output uint8` (the default) every contender gives uint8 NHWC and no "
    "normalisation (tf.data rounds its float resize output). With `--output float` dlstore, DALI and "
    "PyTorch give float32 NCHW; tf.data gives float32 NHWC, TF's own layout, since a transpose would cost "
    "it work no TF user pays. Float output costs tf.data most (compare the CPU ms per image of the "
    "`--output float` and `--output uint8` runs); DALI's cost hardly changes, its "
    "`crop_mirror_normalize` doing the same pass either way.",
    "**CRC.** dlstore and tf.data check each TFRecord's CRC-32C; DALI and the `tfrecord` package do not.",
    "**tf.data determinism.** The ResNet-50 pipeline runs with `deterministic = False`, so a slow image "
    "does not hold up its batch (it can only help tf.data's throughput); the others keep record order.",
    "**Labels** are the stored `image/class/label` (1..1000) everywhere, as int64.",
]


def plan_line(task: str, plan: Dict) -> str:
    """One task's data and counts, for the header and the markdown page."""
    warmup = f"{plan['warmup']} warm-up batch" + ("es" if plan["warmup"] != 1 else "")
    if plan.get("warmup_seconds"):
        warmup += f" and {plan['warmup_seconds']:g} s"
    return (f"{len(plan['files'])} TFRecord files, {report.fmt_bytes(plan['file_bytes'])}, {plan['records']:,} "
            f"records (mean {report.fmt_bytes(plan['payload_bytes'] / max(plan['records'], 1))}), "
            f"{'set ' + plan['size'] if plan.get('size') else 'from --data'}; batch {plan['batch_size']}, {warmup}, "
            f"then {plan['items']:,} {TASKS[task]['unit']} timed; peers' shuffle buffer {plan['shuffle_buffer']:,} "
            f"records; "
            + (f"output {plan['output']}" if task == "resnet50" else f"seq {plan['seq_len']}"))


def markdown_doc(doc: Dict) -> str:
    """The results as a markdown page (docs/pipelines.md): setup, semantics, tables, targets."""
    info = doc["sysinfo"]
    versions = [f"dlstore {info['dlstore']}", f"Python {info['python']}"]
    versions += [f"{k} {v}" for k, v in sorted(doc["versions"].items())]
    rounds = f"{doc['repeat']} round{'s' if doc['repeat'] != 1 else ''}"
    lines = [
        "# Input pipelines: dlstore beside DALI (CPU), tf.data and PyTorch + PIL",
        "",
        f"Written by `{' '.join(doc['command'])}` on {doc['date']}.",
        "",
        (f"- **Machine**: {info['cpu']}, {info['cores']} cores, {info['memory_bytes'] / 1e9:.0f} GB RAM, "
         f"{info['kernel']}; {info['crc']}; GPU: {info['gpu']}"),
        (f"- **Cores**: every contender pinned to CPUs {doc['cores']}; DALI, tf.data and PyTorch with "
         f"{len(doc['cores'])} threads or DataLoader workers, dlstore with its default thread count for those "
         "cores (under its table)"),
    ]
    lines += [f"- **{TASKS[task]['title']}**: {plan_line(task, plan)}" for task, plan in doc["plans"].items()]
    lines += [
        (f"- **Method**: {rounds}; each round runs every contender once in its own process (the order "
         "rotating), the page cache warmed before each; figures are medians over rounds; spread = (max - min) / "
         "median; CPU ms per item is the process tree's user + system time (all threads, DataLoader workers "
         "included); `busiest core` is system-wide; RSS is the process tree's at the end, shared pages "
         "counted in each process; `first batch` is the time to build the pipeline and draw one batch."),
        (f"- **Load**: 1-minute load average {doc['load_average']:.2f} before the run; `others` is the busy "
         "time of the cores not spent by the contender's processes during its timed batches (other "
         "processes, interrupts, hypervisor steal), as a share of all cores: near 0% on an idle machine; "
         "more means other work competed for the cores and the absolute rates are low (the ratios suffer "
         "less, the rounds spreading the drift over all contenders)"),
        "- **Versions**: " + ", ".join(versions),
        "",
    ]
    for task, rows in doc["tables"].items():
        lines += [f"## {TASKS[task]['title']}", "", report.markdown_table(rows, columns(task))]
        lines += [f"{r['contender']}: {r['how']}." for r in rows if r.get("how")] + [""]
    lines += ["## Targets", "", report.markdown_table(doc["targets"], TARGET_COLUMNS)]
    if doc.get("quick"):
        lines += ["`--quick`: a smoke test on tiny sets; start-up costs dominate and the ratios say nothing "
                  "about the targets.", ""]
    lines += ["## What each contender does", "", "The same in all of them:", ""]
    lines += [f"- **{k}**: {v}" for k, v in SAME_FOR_ALL]
    lines += [""]
    for task in doc["tables"]:
        rows = [dict(vars(c), contender=c.label) for c in CONTENDERS.values() if c.task == task]
        cols = SEMANTICS_COLUMNS if task == "resnet50" else [c for c in SEMANTICS_COLUMNS if c.key != "resize"]
        lines += [f"### {TASKS[task]['title']}", "", report.markdown_table(rows, cols)]
    lines += ["### Where the semantics differ", ""] + [f"- {d}" for d in DIFFERENCES] + [""]
    return "\n".join(lines)
