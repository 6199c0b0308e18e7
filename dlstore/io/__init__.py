"""How bytes reach memory: the engines of the C++ core and the choice between them."""
from dlstore.io.select import ENGINES, REQUESTS, EngineChoice, probe_direct, resolve_engine
from dlstore.io.system import available_page_cache_bytes, filesystem_of

__all__ = ["ENGINES", "REQUESTS", "EngineChoice", "available_page_cache_bytes", "filesystem_of", "probe_direct",
           "resolve_engine"]
