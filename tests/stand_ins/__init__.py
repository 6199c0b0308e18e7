"""Host stand-ins for what the tests cannot have here: the GPU libraries dlstore calls (kvikio 26.10, CuPy 14),
installed as ``sys.modules`` entries by the ``gpu_libraries`` fixture (tests/conftest.py), and the CUDA
kernels compiled for the host (``host_kernels``). Each module says what it models and from where."""
