#!/usr/bin/env bash
# Build Horovod 0.28.1 from source against the installed (CPU) torch and Open MPI.
#
# Two patches are needed with today's toolchain, both to the build files only:
#   * cmake >= 4 refuses horovod's `cmake_minimum_required(VERSION 2.8...)` unless
#     CMAKE_POLICY_VERSION_MINIMUM is set;
#   * torch >= 2.1 headers need C++17, horovod 0.28.1 asks for C++14 (top level and torch/).
# The build took 9 minutes on 2 busy cores. Usage: bash examples/install_horovod.sh
# Exit status: 0 when `import horovod.torch` works afterwards, non-zero otherwise.
set -euo pipefail

version="${HOROVOD_VERSION:-0.28.1}"
work="$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

if python -c "import horovod.torch" 2>/dev/null; then
  echo "horovod: already installed ($(python -c 'import horovod; print(horovod.__version__)'))"
  exit 0
fi

# The build runs cmake (the PyPI wheel will do) and compiles against MPI and torch headers.
command -v cmake >/dev/null 2>&1 || pip install -q cmake

cd "$work"
pip download -q --no-deps --no-binary :all: "horovod==$version"
tar xzf "horovod-$version.tar.gz"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
  "horovod-$version/CMakeLists.txt" "horovod-$version/horovod/torch/CMakeLists.txt"
if ! grep -q "CMAKE_CXX_STANDARD 17" "horovod-$version/horovod/torch/CMakeLists.txt"; then
  echo "install_horovod.sh: horovod $version's CMakeLists.txt does not set C++14 as 0.28.1's does: adapt the recipe" >&2
  exit 1
fi

export CMAKE_POLICY_VERSION_MINIMUM=3.5
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
# --no-build-isolation: build against the torch already installed, not a fresh one from PyPI.
pip install -q --no-build-isolation "./horovod-$version"

cd /
python -c "import horovod.torch as hvd; print('horovod:', __import__('horovod').__version__, \
'mpi built:', hvd.mpi_built(), 'gloo built:', hvd.gloo_built())"
