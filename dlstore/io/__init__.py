"""How bytes reach memory: the engines of the C++ core and the choice between them."""
from dlstore.io.select import ENGINES, EngineChoice, available_page_cache_bytes, probe_direct, resolve_engine

__all__ = ["ENGINES", "EngineChoice", "available_page_cache_bytes", "probe_direct", "resolve_engine"]
