"""Host stand-ins for the GPU libraries dlstore calls (kvikio 26.10, CuPy 14), installed as ``sys.modules``
entries by the ``gpu_libraries`` fixture (tests/conftest.py). Each module says what it models and from where."""
