"""Where the agent meets torch: the import hook that attaches it once the program imports torch
(never before), DistributedDataParallel's own timing of its gradient all-reduce, the CUDA device
the program computes on, and the profiler configuration that records every thread."""
from __future__ import annotations

import sys

from .log import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def cuda_device() -> tuple[int, str]:
    """The CUDA device this process computes on and its UUID, for the sidecar, which sees every GPU
    of the node, to tell which is this rank's; (-1, "") until the program has initialised CUDA
    itself: the agent never does, that would take a context on a GPU the program may not use."""
    cuda = sys.modules.get("torch.cuda")
    try:
        if cuda is None or not cuda.is_initialized():
            return -1, ""
        index = cuda.current_device()
        return index, str(cuda.get_device_properties(index).uuid)
    except Exception:  # noqa: BLE001 - the agent never raises into training
        return -1, ""


# The models the process's agent follows; a forked child's agent puts its own set here.
_ddp_models: Any = None


def track_ddp(models: Any) -> None:
    """Remember (weakly, in `models`) each DistributedDataParallel model the program builds from now
    on: its reducer times the gradient all-reduce of sampled iterations itself (DDP's runtime
    logging: the first 10 iterations, then every 100th), the rank's wait in collectives at no cost
    of ours. Called again with another set (a forked child's agent), later models go there."""
    global _ddp_models
    from torch.nn.parallel import DistributedDataParallel

    _ddp_models = models
    original = DistributedDataParallel.__init__
    if getattr(original, "_stepscope_tracks", False):  # a forked child's class is patched already
        return

    def tracked_init(module: Any, *args: Any, **kwargs: Any) -> None:
        original(module, *args, **kwargs)
        _ddp_models.add(module)

    tracked_init._stepscope_tracks = True  # type: ignore[attr-defined]  # a marker on the function, read above
    tracked_init.__wrapped__ = original  # type: ignore[attr-defined]  # as functools.wraps would, for inspect.signature
    tracked_init.__doc__ = original.__doc__
    DistributedDataParallel.__init__ = tracked_init  # the tracking is the point


def all_threads_config() -> Any:
    """The profiler configuration that records every thread with process-wide state, which any
    thread may stop (torch's own debug handler starts and stops it on a server thread); None where
    this torch has no profile_all_threads."""
    try:
        from torch.profiler import _ExperimentalConfig

        return _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):
        return None


class TorchImportWatcher:
    """Lets torch be imported as usual, then attaches the agent: no torch import at interpreter start."""

    def __init__(self, on_import: Any) -> None:
        self._on_import = on_import

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            return None
        # The finders after this one, in order: torch may come from an editable or custom finder.
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = AfterExecLoader(spec.loader, self._on_import)
        return spec


class AfterExecLoader:
    def __init__(self, loader: Any, after: Any) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        # Give the module its real loader back, so resource lookups and inspect see torch's own.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        try:
            self._after()
        except Exception:
            log.exception("stepscope agent: cannot attach to torch; training goes on without it")


