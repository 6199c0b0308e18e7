"""How bytes reach memory: the engines of the C++ core and the choice between them (``select``);
``gds`` reads into GPU memory through kvikio, ``memory`` holds pinned host buffers and the copies
to a GPU, ``cuda`` finds at run time what CUDA this machine has (none of them imports CUDA)."""
from dlstore.io.select import ENGINES, REQUESTS, EngineChoice, probe_direct, resolve_engine
from dlstore.io.system import available_page_cache_bytes, filesystem_of

__all__ = ["ENGINES", "REQUESTS", "EngineChoice", "available_page_cache_bytes", "filesystem_of", "probe_direct",
           "resolve_engine"]
