// The mmap engine: each file mapped once; a read is a view of the mapping, or a copy out of it into
// the slot given, with the pages faulted in ahead in one call.
#include <sys/mman.h>
#include <unistd.h>

#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "dlstore/engine.hpp"
#include "dlstore/error.hpp"

namespace dlstore {
namespace {

// ---- copies out of a mapping that stop at a SIGBUS ---------------------------------------------------
// Touching a page of a mapping past its file's end (the file truncated, or rewritten in place, since
// it was mapped) raises SIGBUS. A copy runs with a recovery point armed for its thread; the handler
// (installed once, at the first copy) jumps back to it, and passes a SIGBUS raised anywhere else to
// the handler before it (Python's faulthandler, say), or to the default action.

// volatile: the compiler knows memcpy leaves it alone, and would otherwise drop the stores around the copy
thread_local sigjmp_buf* volatile t_recover = nullptr;
thread_local volatile bool t_zero_fill = false;  // a MappedTouches lives on this thread
thread_local volatile bool t_lost = false;       // ... and a page was filled with zeros
struct sigaction g_previous;
uintptr_t g_page = 4096;

void on_sigbus(int sig, siginfo_t* info, void* context) {
  if (t_recover != nullptr) siglongjmp(*t_recover, 1);
  if (t_zero_fill && info != nullptr && info->si_addr != nullptr) {
    // A page its file lost, touched in place: zeros mapped over it, and the touch runs again on return.
    const uintptr_t page = reinterpret_cast<uintptr_t>(info->si_addr) & ~(g_page - 1);
    if (::mmap(reinterpret_cast<void*>(page), g_page, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) !=
        MAP_FAILED) {
      t_lost = true;
      return;
    }
  }
  if ((g_previous.sa_flags & SA_SIGINFO) && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    ::signal(SIGBUS, SIG_DFL);  // the fault repeats on return, now with the default action
  }
}

void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;  // not blocked while handled: the jump leaves the mask as it was
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous);
  });
}

// Copies n bytes out of a mapping; false when a page of it is gone (nothing to say how much was copied).
bool copy_from_mapping(uint8_t* dst, const uint8_t* src, size_t n) {
  install_sigbus_handler();
  sigjmp_buf recover;
  if (sigsetjmp(recover, 0) != 0) {
    t_recover = nullptr;
    return false;
  }
  t_recover = &recover;
  std::memcpy(dst, src, n);
  t_recover = nullptr;
  return true;
}

}  // namespace

MappedTouches::MappedTouches() {
  install_sigbus_handler();
  t_lost = false;
  t_zero_fill = true;
}

MappedTouches::~MappedTouches() { t_zero_fill = false; }

bool MappedTouches::lost() const { return t_lost; }

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
      const uint8_t* at = map.data() + r.offset;
      try {
        DLSTORE_EXPECT(r.offset + r.len <= map.size(), Io, map.path(), static_cast<int64_t>(r.offset),
                       "short read: expected " << r.len << " bytes at offset " << r.offset << ", the file has "
                                               << map.size() << " (was the file truncated while being read?)");
        // Prefaulting reports a device error, or a file cut short since it was mapped, as an error,
        // where touching a bad page is a SIGBUS. A small read is not prefaulted (the system call would
        // cost more than the copy), so a copy of it stops at such a page instead.
        if (r.len >= kPopulateMin) map.populate(r.offset, r.len);
        if (r.slot) {
          if (r.len && !copy_from_mapping(r.slot, at, r.len)) map.lost(r.offset, r.len);
          at = r.slot;
        }
      } catch (const Error&) {
        r.error = std::current_exception();
        continue;
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
