"""Which backend runs kernels: ``cpu`` (C/OpenMP), ``cuda`` (needs a GPU CuPy can see) or ``auto`` (cuda when
there is one, else cpu, as DESIGN.md says)."""

BACKENDS = ("auto", "cpu", "cuda")


class BackendUnavailableError(RuntimeError):
    """The backend asked for cannot run on this machine."""


def gpu_available() -> bool:
    """Whether CuPy is installed and sees a CUDA device."""
    try:
        import cupy
    except ImportError:
        return False
    try:
        return bool(cupy.cuda.is_available())
    except Exception:  # a broken driver or runtime install counts as no GPU
        return False


def resolve_backend(name: str) -> str:
    """``cpu`` or ``cuda`` for ``name``.

    Raises ValueError for an unknown name and BackendUnavailableError for ``cuda`` without a GPU."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    if name == "auto":
        return "cuda" if gpu_available() else "cpu"
    if name == "cuda" and not gpu_available():
        raise BackendUnavailableError("the cuda backend needs an NVIDIA GPU that CuPy can see; use --backend cpu")
    return name
