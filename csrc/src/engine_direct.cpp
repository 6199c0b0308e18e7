// The direct engine: O_DIRECT preads of whole aligned blocks into aligned slots, bypassing the page
// cache; a file whose filesystem refuses O_DIRECT is read buffered, saying why. A read whose bytes the
// page cache already holds is served from it (Engine::read_cached): O_DIRECT would read them again
// from the device, at a fraction of the cache's rate.
#include "dlstore/engine.hpp"

namespace dlstore {
namespace {

class DirectEngine : public Engine {
 public:
  const char* name() const override { return "direct"; }
  std::shared_ptr<OpenedFile> open(const std::string& path, const OpenHints& hints,
                                   std::string* note) const override {
    auto f = std::make_shared<OpenedFile>();
    std::string why;
    f->fh = open_direct(path, hints.chunk_size, &f->offset_align, &f->memory_align, &why);
    if (!f->fh) {
      *note = "direct -> buffered for " + why;
      return buffered_engine()->open(path, hints, note);
    }
    f->path = path;
    f->engine = shared_from_this();
    f->size = f->fh->size();
    f->cache_first = hints.direct_cache && page_cache_tells(f->fh->fd());  // asked once per file
    return f;
  }
};

}  // namespace

std::shared_ptr<const Engine> make_direct_engine(const EngineOptions&, std::string*) {
  static const std::shared_ptr<const Engine> engine = std::make_shared<DirectEngine>();
  return engine;
}

}  // namespace dlstore
