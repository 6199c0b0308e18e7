"""How bytes reach memory: the engines of the C++ core and the choice between them (``select``);
``gds`` reads into GPU memory through kvikio, ``memory`` holds pinned host buffers and the copies
to a GPU, ``cuda`` finds at run time what CUDA this machine has (none of them imports CUDA);
``system`` and ``pagecache`` are what the machine says about mounts, memory, cores and the page cache.

May import: the C++ core, ``errors``, ``settings``, :mod:`dlstore.formats`; the gds backend finds
indexes through :mod:`dlstore.sources.indexing` (imported where it is used). Never the pipelines,
adapters, bench or tools."""
from dlstore.io.select import ENGINES, REQUESTS, EngineChoice, probe_direct, resolve_engine
from dlstore.io.system import available_page_cache_bytes, filesystem_of

__all__ = ["ENGINES", "REQUESTS", "EngineChoice", "available_page_cache_bytes", "filesystem_of", "probe_direct",
           "resolve_engine"]
