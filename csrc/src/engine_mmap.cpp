// The mmap engine: each file mapped once; a read is a view of the mapping, or a copy out of it into
// the slot given, with the pages faulted in ahead in one call.
#include <cstring>

#include "dlstore/engine.hpp"
#include "dlstore/error.hpp"

namespace dlstore {
namespace {

// A read at least this large is prefaulted in one call (MADV_POPULATE_READ); smaller ones fault in as
// they are touched, since there the system call costs more than the faults.
constexpr size_t kPopulateMin = 64u << 10;

class MmapEngine : public Engine {
 public:
  const char* name() const override { return "mmap"; }
  bool views() const override { return true; }

  std::shared_ptr<OpenedFile> open(const std::string& path, const OpenHints& hints, std::string*) const override {
    auto f = std::make_shared<OpenedFile>();
    f->path = path;
    f->engine = shared_from_this();
    f->map = std::make_shared<Mapping>(path, hints.sequential);
    f->size = f->map->size();
    return f;
  }

  void read(ReadRequest* reqs, size_t n) const override {
    for (size_t i = 0; i < n; ++i) {
      ReadRequest& r = reqs[i];
      const Mapping& map = *r.file->map;
      try {
        DLSTORE_EXPECT(r.offset + r.len <= map.size(), Io, map.path(), static_cast<int64_t>(r.offset),
                       "short read: expected " << r.len << " bytes at offset " << r.offset << ", the file has "
                                               << map.size() << " (was the file truncated while being read?)");
        // Prefaulting reports a device error as an error, where touching a bad page is a SIGBUS.
        if (r.len >= kPopulateMin) map.populate(r.offset, r.len);
      } catch (const Error&) {
        r.error = std::current_exception();
        continue;
      }
      const uint8_t* at = map.data() + r.offset;
      if (r.slot) {
        if (r.len) std::memcpy(r.slot, at, r.len);
        at = r.slot;
      }
      r.data = at;
      r.bytes_read = r.len;
    }
  }
};

}  // namespace

std::shared_ptr<const Engine> make_mmap_engine(const EngineOptions&, std::string*) {
  static const std::shared_ptr<const Engine> engine = std::make_shared<MmapEngine>();
  return engine;
}

}  // namespace dlstore
