// The engine registry: every engine by name, and the factory that makes it. A new engine is its own
// engine_NAME.cpp defining make_NAME_engine, plus its line in kEngines below; Python lists the names
// from here (dlstore._C.engine_names()).
#include "dlstore/engine.hpp"
#include "dlstore/error.hpp"

namespace dlstore {

// Each defined in its engine's own .cpp. A factory may hand back another engine where the kernel
// refuses this one here, saying why in `note`.
std::shared_ptr<const Engine> make_buffered_engine(const EngineOptions& opts, std::string* note);
std::shared_ptr<const Engine> make_mmap_engine(const EngineOptions& opts, std::string* note);
std::shared_ptr<const Engine> make_direct_engine(const EngineOptions& opts, std::string* note);
std::shared_ptr<const Engine> make_io_uring_engine(const EngineOptions& opts, std::string* note);

namespace {

struct EngineEntry {
  const char* name;
  std::shared_ptr<const Engine> (*make)(const EngineOptions&, std::string*);
};

constexpr EngineEntry kEngines[] = {
    {"buffered", make_buffered_engine},
    {"mmap", make_mmap_engine},
    {"direct", make_direct_engine},
    {"io_uring", make_io_uring_engine},
};

}  // namespace

std::vector<std::string> engine_names() {
  std::vector<std::string> out;
  for (const EngineEntry& e : kEngines) out.push_back(e.name);
  return out;
}

std::shared_ptr<const Engine> make_engine(const EngineOptions& opts, std::string* note) {
  for (const EngineEntry& e : kEngines)
    if (opts.engine == e.name) return e.make(opts, note);
  std::string known;
  for (const EngineEntry& e : kEngines) known += (known.empty() ? "" : ", ") + std::string(e.name);
  throw_error(ErrorKind::Generic, "", -1, "unknown I/O engine '" + opts.engine + "' (" + known + ")");
}

}  // namespace dlstore
