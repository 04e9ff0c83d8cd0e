"""Compilers: source text -> an artifact on disk, cached by what invalidates it.

``cpu.compile_c`` (system C compiler -> shared library, loaded with ctypes) and ``cuda.compile_cuda``
(CUDA C++ -> PTX with NVRTC, nvcc as fallback; loaded into ``cupy.RawModule``). Both return a
:class:`transforms.results.BuildResult` and never raise for a bad source. Standard library only at import
time (CuPy is imported on use): this package is on the GPU measurement path.
"""
