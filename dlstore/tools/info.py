"""``dlstore info``: one report of what this machine offers dlstore.

CPU CRC-32C, the JPEG decoder the build linked, O_DIRECT on given paths, MPI, and the GPU path: the
CUDA driver and devices, the runtime, kvikio, CuPy, libcufile, nvidia-fs and the compat-mode
settings, ending with what ``io="gds"`` would do here (or exactly what it lacks). The GPU facts are
:func:`dlstore.io.cuda.probe_cuda`'s, the ones ``io="gds"`` itself checks.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from dlstore import __version__
from dlstore.io.cuda import CudaFacts, gds_verdict, probe_cuda
from dlstore.io.select import probe_direct
from dlstore.io.system import cpuinfo_field, filesystem_of
from dlstore.pipeline.decode import native_jpeg_available

__all__ = ["collect_info", "format_info", "direct_on"]


def _cpu_flags() -> List[str]:
    return (cpuinfo_field("flags") or "").split()


def _crc() -> Dict[str, object]:
    sse42 = "sse4_2" in _cpu_flags()
    try:
        from dlstore import _C
    except ImportError as e:
        return {"hardware": None, "sse4_2": sse42, "line": f"unknown: the C++ core is not built ({e})"}
    hw = bool(_C.crc32c_is_hardware())
    line = ("hardware (SSE4.2 crc32 instruction)" if hw
            else "software table" + (" (the CPU has SSE4.2, the build does not use it)" if sse42 else
                                     " (no SSE4.2 on this CPU)"))
    return {"hardware": hw, "sse4_2": sse42, "line": line}


def _jpeg() -> Dict[str, object]:
    try:

        ok, what = native_jpeg_available()
    except ImportError as e:
        return {"native": False, "line": f"unknown: the C++ core is not built ({e})"}
    if ok:
        return {"native": True, "line": f"{what}, linked when the C++ core was built (setup.py found jpeglib.h "
                                        f"and -ljpeg)"}
    return {"native": False, "line": f"not in this build ({what}); JPEGs are decoded with Pillow"}


def direct_on(path: str) -> str:
    """Whether O_DIRECT works on ``path`` (a file, or a directory: its first file, else a probe file
    written there and removed): ``"yes (fs ...)"`` or the reason it does not."""

    fs = filesystem_of(path)
    where = f"{fs['fstype']} at {fs['mount'] or '?'}"
    if not os.path.exists(path):
        return f"no such file or directory ({where})"
    target, probe = path, None
    if os.path.isdir(path):
        files = sorted(n for n in os.listdir(path) if os.path.isfile(os.path.join(path, n)))
        if files:
            target = os.path.join(path, files[0])
        else:
            try:
                fd, probe = tempfile.mkstemp(prefix=".dlstore-o_direct-", dir=path)
                os.write(fd, b"\0" * 4096)
                os.close(fd)
            except OSError as e:
                return f"unknown: empty directory and no probe file can be written ({e.strerror}; {where})"
            target = probe
    try:
        refused = probe_direct(target)
    finally:
        if probe:
            os.unlink(probe)
    return f"refused: {refused}" if refused else f"yes ({where})"


def _mpi(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Dict[str, object]:
    out: Dict[str, object] = {}
    try:
        import mpi4py  # importing the package (not mpi4py.MPI) does not start MPI

        out["mpi4py"] = mpi4py.__version__
    except ImportError:
        out["mpi4py"] = None
    mpirun = shutil.which("mpirun")
    out["mpirun"] = mpirun
    version = ""
    if mpirun:
        try:
            done = run([mpirun, "--version"], capture_output=True, text=True, timeout=10)
            version = (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr) else ""
        except (OSError, subprocess.SubprocessError):
            version = "(mpirun --version failed)"
    out["mpirun_version"] = version
    parts = [f"mpi4py {out['mpi4py']}" if out["mpi4py"] else "mpi4py not installed",
             f"mpirun {mpirun}" + (f" ({version})" if version else "") if mpirun else "no mpirun on PATH"]
    out["line"] = "; ".join(parts)
    return out


def _gpu_rows(facts: CudaFacts) -> List[Tuple[str, str]]:
    verdict = gds_verdict(facts)
    rows = [("CUDA driver", facts.driver_error if facts.driver is None else
             f"{facts.driver}" + (f" ({facts.driver_error})" if facts.driver_error else ""))]
    rows.append(("GPUs", ", ".join(f"{i}: {n}" for i, n in enumerate(facts.devices)) + f" ({facts.devices_how})"
                 if facts.devices else f"none ({facts.driver_error or 'not counted'})"))
    rows.append(("kvikio", facts.kvikio or facts.kvikio_error))
    rows.append(("CuPy", facts.cupy or facts.cupy_error))
    rows.append(("libcufile", facts.libcufile or "not found"))
    rows.append(("nvidia-fs", ("loaded" if facts.nvidia_fs else "not loaded") + f" ({facts.nvidia_fs_how})"))
    compat = f"KVIKIO_COMPAT_MODE {facts.kvikio_compat}"
    if facts.kvikio_compat_preferred is not None:
        compat += f", kvikio prefers {'compat' if facts.kvikio_compat_preferred else 'GDS'}"
    if facts.cufile_json:
        allow = {True: "true", False: "false", None: "not set (true)"}[facts.cufile_allow_compat]
        p2pdma = {True: "true", False: "false", None: "not set (false)"}[facts.cufile_p2pdma]
        compat += f"; {facts.cufile_json}: allow_compat_mode {allow}, use_pci_p2pdma {p2pdma}"
    else:
        compat += "; no cufile.json (cuFile's defaults: allow_compat_mode true)"
    rows.append(("compat mode", compat))
    rows.append(("io='gds'", f"cannot run: {verdict.reason}" if verdict.missing else f"runs, {verdict.reason}"))
    return rows


def collect_info(paths: Sequence[str] = (), facts: Optional[CudaFacts] = None) -> Dict[str, object]:
    """The report as a dict (``dlstore info --json``); ``facts`` defaults to a fresh :func:`probe_cuda`."""

    facts = probe_cuda(init=True) if facts is None else facts
    verdict = gds_verdict(facts)
    return {
        "dlstore": __version__,
        "crc32c": _crc(),
        "jpeg": _jpeg(),
        "o_direct": {os.fspath(p): direct_on(os.fspath(p)) for p in paths},
        "mpi": _mpi(),
        "gpu": facts.as_dict(),
        "gds": {"runs": verdict.runs, "mode": verdict.mode, "reason": verdict.reason, "missing": verdict.missing},
        "rows": _gpu_rows(facts),
    }


def format_info(info: Dict[str, object]) -> str:
    """The report as aligned ``name  value`` lines."""
    rows: List[Tuple[str, str]] = [("dlstore", str(info["dlstore"])), ("CRC-32C", info["crc32c"]["line"]),
                                   ("JPEG decode", info["jpeg"]["line"])]
    for path, line in info["o_direct"].items():
        rows.append((f"O_DIRECT {path}", line))
    if not info["o_direct"]:
        rows.append(("O_DIRECT", "give paths (dlstore info PATH...) to check them"))
    rows.append(("MPI", info["mpi"]["line"]))
    rows += [tuple(r) for r in info["rows"]]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
