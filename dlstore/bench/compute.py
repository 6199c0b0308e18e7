"""Accelerator emulation, as MLPerf Storage does it: after each batch the consumer sleeps one
accelerator's time per batch; the presets are the published workloads' compute times."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from dlstore.bench.mlperf_workloads import workload


__all__ = ["AU_THRESHOLD_PCT", "ComputePreset", "Compute", "COMPUTE_PRESETS", "resolve_compute"]

AU_THRESHOLD_PCT = 90.0  # MLPerf Storage counts a run as feeding its accelerators at AU >= 90%


@dataclass(frozen=True)
class ComputePreset:
    """One accelerator's training rate (samples/s), per variant (BERT: sequence length), and where it comes from."""

    name: str
    rates: Dict[Optional[int], float]
    source: str


@dataclass(frozen=True)
class Compute:
    """The emulated accelerator: seconds of computation per batch, and what they stand for."""

    seconds_per_batch: float
    label: str
    source: str
    name: str = "accelerator"

    def samples_per_s(self, batch_size: int) -> float:
        """Samples per second one emulated accelerator consumes."""
        return batch_size / self.seconds_per_batch


def _mlperf(accelerator: str) -> ComputePreset:
    """MLPerf Storage's ResNet-50 row on ``accelerator``, from the one table of its rounds' values."""
    row = workload("resnet50", accelerator)
    source = f"{row.source.format(name=row.name)}: {row.computation_time:g} s per batch of {row.batch_size}"
    return ComputePreset(accelerator, {None: row.samples_per_s}, source)


COMPUTE_PRESETS: Dict[str, Dict[str, ComputePreset]] = {
    "resnet50": {"a100": _mlperf("a100"), "h100": _mlperf("h100")},
    "bert": {
        # No MLPerf Storage figure exists for BERT on these GPUs: order-of-magnitude estimates of
        # BERT-Large pretraining with mixed precision, sequences/s per GPU at seq 128 and 384.
        "a100": ComputePreset("a100", {128: 800.0, 384: 250.0},
                              "rough estimate (BERT-Large, mixed precision), not a measurement; "
                              "pass --compute MS with your own step time"),
        "h100": ComputePreset("h100", {128: 1600.0, 384: 500.0},
                              "rough estimate (about 2x A100), not a measurement; "
                              "pass --compute MS with your own step time"),
        # The Graphcore IPU-POD64 + DDN AI400X2 reference architecture, BERT-Large, items/s per Poplar
        # host (8 IPUs of an IPU-POD64).
        "pod64-host": ComputePreset("pod64-host", {128: 3708.0, 384: 1054.0},
                                    "Graphcore IPU-POD64 + DDN AI400X2 paper, BERT-Large items/s per host"),
    },
}


def resolve_compute(text: Optional[str], workload: str, batch_size: int,
                    variant: Optional[int] = None) -> Optional[Compute]:
    """``--compute``: a preset name (``a100``, ``h100``, ...) or milliseconds per batch; None: no emulation.

    A preset's rate is turned into seconds per batch of ``batch_size``.

    Raises
    ------
    ValueError
        For an unknown preset, a variant the preset has no figure for, or a non-positive time.
    """
    if text is None:
        return None
    try:
        ms: Optional[float] = float(text)
    except ValueError:
        ms = None
    if ms is not None:
        if not 0 < ms < float("inf"):
            raise ValueError(f"--compute must be a positive number of milliseconds per batch, not {text}")
        return Compute(ms / 1e3, f"{ms:g} ms per batch of {batch_size} "
                                 f"({batch_size / (ms / 1e3):,.0f} samples/s per accelerator)",
                       "given on the command line", f"{ms:g} ms/batch")
    presets = COMPUTE_PRESETS.get(workload, {})
    if text not in presets:
        raise ValueError(f"--compute {text!r}: not a number of milliseconds per batch nor a preset for "
                         f"{workload} ({', '.join(presets) or 'none'})")
    preset = presets[text]
    rate = preset.rates.get(variant, preset.rates.get(None))
    if rate is None:
        raise ValueError(f"--compute {text}: no figure for {workload} at {variant} "
                         f"(has {', '.join(str(k) for k in preset.rates)})")
    seconds = batch_size / rate
    return Compute(seconds, f"{text}: {seconds * 1e3:.0f} ms per batch of {batch_size} "
                            f"({rate:,.0f} samples/s per accelerator)", preset.source, text)
