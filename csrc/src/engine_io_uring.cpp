// The io_uring engine: every read of a call in flight at once (up to the device's queue depth), through
// the kernel's io_uring with raw system calls and <linux/io_uring.h> (no liburing), so that a cold
// epoch that reads record by record (a global shuffle) keeps the device busy the way fio's randread
// at depth N does, and a large read is issued as several reads in flight.
//
// Files are opened O_DIRECT where the direct engine would open them: this engine is for data that
// does not stay in the page cache (io="auto" picks it only then), where O_DIRECT saves the copy out of
// the cache and does not evict what else is cached. Where O_DIRECT is refused (tmpfs) the file is
// still read through the ring from a buffered descriptor: io_uring serves page-cache hits inline.
//
// A kernel that refuses io_uring_setup (a seccomp filter such as Docker's default, kernel.io_uring_disabled,
// a kernel before 5.6) gets the direct engine instead, with a note saying why.
#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "dlstore/engine.hpp"
#include "dlstore/engine_io_uring.hpp"
#include "dlstore/error.hpp"

namespace dlstore {

std::shared_ptr<const Engine> make_direct_engine(const EngineOptions& opts, std::string* note);

namespace {

// A large read goes out as reads of this many bytes, all in flight: a multiple of every direct-I/O
// alignment accepted (64 KiB at most), and about the largest request a disk takes whole.
constexpr size_t kSplit = 1u << 20;

std::mutex refusal_mu;
std::string simulated_refusal;  // set by tests (simulate_io_uring_refusal), under refusal_mu

int io_uring_setup_call(unsigned entries, io_uring_params* p) {
  return static_cast<int>(::syscall(__NR_io_uring_setup, entries, p));
}

int io_uring_enter_call(int fd, unsigned to_submit, unsigned min_complete, unsigned flags) {
  return static_cast<int>(::syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, nullptr, 0));
}

std::string setup_refusal(int err) {
  switch (err) {
    case EPERM:
      return "io_uring_setup refused with EPERM (a seccomp filter, or sysctl kernel.io_uring_disabled)";
    case ENOSYS:
      return "this kernel has no io_uring (ENOSYS: before Linux 5.1, or built without it)";
    default:
      return std::string("io_uring_setup failed: ") + std::strerror(err) + " (errno " + std::to_string(err) + ")";
  }
}

// One submission and completion queue pair, mapped from the kernel, used by one thread only.
class Ring {
 public:
  explicit Ring(unsigned entries) {
    io_uring_params p;
    std::memset(&p, 0, sizeof(p));
    fd_ = io_uring_setup_call(entries, &p);
    if (fd_ < 0) throw_error(ErrorKind::Io, "", -1, setup_refusal(errno));
    entries_ = p.sq_entries;
    sq_bytes_ = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    cq_bytes_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    const bool single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;  // both rings in one mapping
    if (single) sq_bytes_ = cq_bytes_ = std::max(sq_bytes_, cq_bytes_);
    sq_ = map(sq_bytes_, IORING_OFF_SQ_RING);
    cq_ = single ? sq_ : map(cq_bytes_, IORING_OFF_CQ_RING);
    sqe_bytes_ = p.sq_entries * sizeof(io_uring_sqe);
    sqes_ = static_cast<io_uring_sqe*>(map(sqe_bytes_, IORING_OFF_SQES));
    auto at = [](void* base, uint32_t off) { return reinterpret_cast<unsigned*>(static_cast<char*>(base) + off); };
    sq_tail_ = at(sq_, p.sq_off.tail);
    sq_mask_ = *at(sq_, p.sq_off.ring_mask);
    sq_array_ = at(sq_, p.sq_off.array);
    cq_head_ = at(cq_, p.cq_off.head);
    cq_tail_ = at(cq_, p.cq_off.tail);
    cq_mask_ = *at(cq_, p.cq_off.ring_mask);
    cqes_ = reinterpret_cast<io_uring_cqe*>(static_cast<char*>(cq_) + p.cq_off.cqes);
  }
  ~Ring() { release(); }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  unsigned entries() const { return entries_; }

  // Queues a read of `len` bytes at `offset` of `fd` into `dst`; the caller keeps no more than
  // entries() reads queued or in flight.
  void queue_read(int fd, void* dst, unsigned len, uint64_t offset, uint64_t tag) {
    const unsigned tail = *sq_tail_;  // only this thread moves the tail
    const unsigned idx = tail & sq_mask_;
    io_uring_sqe* sqe = &sqes_[idx];
    std::memset(sqe, 0, sizeof(*sqe));
    sqe->opcode = IORING_OP_READ;
    sqe->fd = fd;
    sqe->addr = reinterpret_cast<uint64_t>(dst);
    sqe->len = len;
    sqe->off = offset;
    sqe->user_data = tag;
    sq_array_[idx] = idx;
    __atomic_store_n(sq_tail_, tail + 1, __ATOMIC_RELEASE);  // the kernel sees the entry filled
    ++queued_;
  }

  // Submits the queued reads and waits for at least one completion (`wait`), or returns at once.
  void submit(bool wait = true) {
    for (;;) {
      const int r = io_uring_enter_call(fd_, queued_, wait ? 1 : 0, wait ? IORING_ENTER_GETEVENTS : 0);
      if (r >= 0) {
        queued_ -= std::min<unsigned>(queued_, static_cast<unsigned>(r));
        if (queued_ == 0) return;
        continue;  // some entries not taken yet (short of kernel memory): offer them again
      }
      if (errno == EINTR) continue;
      throw_errno("", -1, "io_uring_enter", errno);
    }
  }

  // Waits until `inflight` reads are back, ignoring their results: after a failure of the ring
  // itself, so that no read still writes into a slot once the call returns. Retries for as long as
  // it takes: a thread stuck here is better than a buffer written after it went back to its pool.
  void drain(size_t inflight) {
    while (inflight > 0) {
      const int r = io_uring_enter_call(fd_, queued_, 1, IORING_ENTER_GETEVENTS);
      if (r > 0) queued_ -= std::min<unsigned>(queued_, static_cast<unsigned>(r));
      if (r < 0 && errno != EINTR) ::usleep(1000);
      reap([&](uint64_t, int) { --inflight; });
    }
  }

  // Calls f(tag, result) for each completion there; result is bytes read or -errno.
  template <class F>
  void reap(F&& f) {
    unsigned head = *cq_head_;
    const unsigned tail = __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE);
    for (; head != tail; ++head) {
      const io_uring_cqe& c = cqes_[head & cq_mask_];
      f(c.user_data, c.res);
    }
    __atomic_store_n(cq_head_, head, __ATOMIC_RELEASE);  // the kernel may reuse the entries
  }

 private:
  void* map(size_t bytes, off_t what) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, what);
    if (p == MAP_FAILED) {
      const int err = errno;
      release();
      throw_errno("", -1, "mmap of an io_uring queue", err);
    }
    return p;
  }
  void release() {
    if (sqes_) ::munmap(sqes_, sqe_bytes_);
    if (cq_ && cq_ != sq_) ::munmap(cq_, cq_bytes_);
    if (sq_) ::munmap(sq_, sq_bytes_);
    if (fd_ >= 0) ::close(fd_);
    sqes_ = nullptr;
    sq_ = cq_ = nullptr;
    fd_ = -1;
  }

  int fd_ = -1;
  unsigned entries_ = 0;
  unsigned queued_ = 0;  // queued, not yet taken by the kernel
  size_t sq_bytes_ = 0, cq_bytes_ = 0, sqe_bytes_ = 0;
  void* sq_ = nullptr;
  void* cq_ = nullptr;
  io_uring_sqe* sqes_ = nullptr;
  unsigned* sq_tail_ = nullptr;
  unsigned sq_mask_ = 0;
  unsigned* sq_array_ = nullptr;
  unsigned* cq_head_ = nullptr;
  unsigned* cq_tail_ = nullptr;
  unsigned cq_mask_ = 0;
  io_uring_cqe* cqes_ = nullptr;
};

// An I/O error about `path` at `offset`, as throw_errno makes them, for a request to carry.
std::exception_ptr io_error(const std::string& path, uint64_t offset, const std::string& what, int err) {
  Error e = located_error(ErrorKind::Io, path, static_cast<int64_t>(offset), what);
  e.err = err;
  return std::make_exception_ptr(e);
}

// Each I/O thread has a ring of its own: rings are single-threaded here, and a thread's reads never
// wait on another's. It is closed when the thread ends.
thread_local std::unique_ptr<Ring> thread_ring;

// Reads in flight on `fh`'s device: the setting, else what the device queues (nr_requests), at most
// kMaxQueueDepth; kMaxQueueDepth where the file lies on no block device. `why` says which.
size_t queue_depth_for(const FileHandle& fh, size_t setting, std::string* why) {
  if (setting > 0) {
    if (why) *why = "the queue_depth setting";
    return setting;
  }
  const uint32_t device = fh.device_requests();
  if (why)
    *why = device ? "the device's nr_requests " + std::to_string(device) + ", capped at " +
                        std::to_string(kMaxQueueDepth)
                  : "no block device queue found, so the cap, " + std::to_string(kMaxQueueDepth);
  return device ? std::min<size_t>(device, kMaxQueueDepth) : kMaxQueueDepth;
}

// A piece of one request: up to kSplit bytes into the request's slot.
struct SubRead {
  size_t request;
  uint64_t offset;  // in the file
  uint8_t* dst;
  size_t len;
  size_t got = 0;
  bool ended = false;  // came back short: the end of the file (or an error)
};

class IoUringEngine : public Engine {
 public:
  explicit IoUringEngine(size_t queue_depth) : queue_depth_(queue_depth) {}
  const char* name() const override { return "io_uring"; }

  std::shared_ptr<OpenedFile> open(const std::string& path, const OpenHints& hints,
                                   std::string* note) const override {
    auto f = std::make_shared<OpenedFile>();
    f->path = path;
    f->engine = shared_from_this();
    std::string why;
    f->fh = open_direct(path, hints.chunk_size, &f->offset_align, &f->memory_align, &why);
    if (!f->fh) {
      // Still through the ring: a buffered descriptor, served from the page cache.
      *note = "io_uring without O_DIRECT for " + why;
      f->fh = std::make_shared<FileHandle>(path, false);
    } else {
      // What the page cache holds already is read from it (Engine::read_cached), where the kernel says so to
      // this process (asked once per file).
      f->cache_first = hints.direct_cache && page_cache_tells(f->fh->fd());
    }
    f->size = f->fh->size();
    f->queue_depth = static_cast<uint32_t>(queue_depth_for(*f->fh, queue_depth_, nullptr));
    return f;
  }

  void read(ReadRequest* reqs, size_t n) const override {
    if (n == 0) return;
    size_t depth = 1;
    for (size_t i = 0; i < n; ++i) depth = std::max<size_t>(depth, reqs[i].file->queue_depth);
    Ring* ring = ring_for(static_cast<unsigned>(depth));
    if (!ring) {
      Engine::read(reqs, n);  // the kernel refused a ring on this thread: pread, noted
      return;
    }
    depth = std::min<size_t>(depth, ring->entries());

    std::vector<SubRead> subs;
    subs.reserve(n);
    size_t left = 0;  // sub-reads not ended yet
    auto through_ring = [&](size_t i) {
      const ReadRequest& r = reqs[i];
      const uint64_t at = align_down(r.offset, r.file->offset_align);
      const size_t want = r.file->slot_bytes(r.offset, r.len);
      for (size_t done = 0; done < want; done += kSplit, ++left)  // nothing for an empty request
        subs.push_back({i, at + done, r.slot + done, std::min(kSplit, want - done)});
    };
    // What the page cache holds is read from it here, not through the ring: once the device's reads are
    // in flight, so that they do not wait for it.
    std::vector<uint8_t> cached(n, 0);
    for (size_t i = 0; i < n; ++i) {
      if (cache_holds(reqs[i]))
        cached[i] = 1;
      else
        through_ring(i);
    }
    bool cache_read = std::find(cached.begin(), cached.end(), 1) == cached.end();

    std::vector<size_t> retry;  // sub-reads to queue again (interrupted, or short of the end)
    size_t next = 0, inflight = 0;
    auto queue = [&](size_t k) {
      SubRead& s = subs[k];
      const ReadRequest& r = reqs[s.request];
      ring->queue_read(r.file->fh->fd(), s.dst + s.got, static_cast<unsigned>(s.len - s.got), s.offset + s.got, k);
      ++inflight;
    };
    while (left > 0 || !cache_read) {
      while (inflight < depth && !retry.empty()) {
        queue(retry.back());
        retry.pop_back();
      }
      while (inflight < depth && next < subs.size()) queue(next++);
      try {
        if (inflight > 0) ring->submit(cache_read);
        if (!cache_read) {
          cache_read = true;
          for (size_t i = 0; i < n; ++i)  // a path that no longer opens the file: the device reads it after all
            if (cached[i] && !read_cached(reqs[i], true)) {
              cached[i] = 0;
              through_ring(i);
            }
          continue;
        }
      } catch (const Error& e) {
        // The ring itself failed (not a read): the reads already in flight still complete into
        // their slots, so wait for them before the slots can go back to their pool.
        ring->drain(inflight);
        for (size_t i = 0; i < n; ++i)  // the cache's requests too where they were not read yet
          if (!reqs[i].error && (!cached[i] || !cache_read))
            reqs[i].error = io_error(reqs[i].file->path, reqs[i].offset, e.reason, e.err);
        return;
      } catch (...) {
        ring->drain(inflight);  // not a read's failure either (memory): no slot written after the call
        throw;
      }
      ring->reap([&](uint64_t tag, int res) {
        --inflight;
        SubRead& s = subs[tag];
        ReadRequest& r = reqs[s.request];
        if (res == -EINTR || res == -EAGAIN) {
          retry.push_back(tag);
          return;
        }
        if (res < 0) {
          if (!r.error)
            r.error = io_error(r.file->path, s.offset + s.got,
                               "io_uring read of " + std::to_string(s.len - s.got) + " bytes failed: " +
                                   std::strerror(-res) + " (errno " + std::to_string(-res) + ")",
                               -res);
          s.ended = true;
          --left;
          return;
        }
        s.got += static_cast<size_t>(res);
        // Short: the end of the file, unless more can follow (a buffered read, or an O_DIRECT one
        // that stopped on a block boundary), which is asked for again.
        const bool more = res > 0 && s.got < s.len && (r.file->offset_align == 1 || s.got % 512 == 0);
        if (more) {
          retry.push_back(tag);
          return;
        }
        s.ended = s.got < s.len;
        --left;
      });
    }
    // A request's bytes are its sub-reads' up to the first that came back short.
    std::vector<size_t> got(n, 0);
    std::vector<uint8_t> stopped(n, 0);
    for (const SubRead& s : subs) {
      if (stopped[s.request]) continue;
      got[s.request] += s.got;
      if (s.ended) stopped[s.request] = 1;
    }
    for (size_t i = 0; i < n; ++i)
      if (!reqs[i].error && !cached[i]) check_read(reqs[i], got[i]);
  }

  std::vector<std::string> notes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return ring_note_.empty() ? std::vector<std::string>{} : std::vector<std::string>{ring_note_};
  }

 private:
  // This thread's ring with room for `depth` reads, or null (noted) where the kernel refuses one.
  Ring* ring_for(unsigned depth) const {
    if (thread_ring && thread_ring->entries() >= depth) return thread_ring.get();
    try {
      thread_ring.reset();
      thread_ring.reset(new Ring(depth));
      return thread_ring.get();
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mu_);
      if (ring_note_.empty()) ring_note_ = std::string("io_uring -> pread on an I/O thread: ") + e.reason;
      return nullptr;
    }
  }

  size_t queue_depth_;
  mutable std::mutex mu_;
  mutable std::string ring_note_;
};

}  // namespace

std::string io_uring_refusal() {
  {
    std::lock_guard<std::mutex> lock(refusal_mu);
    if (!simulated_refusal.empty()) return simulated_refusal;
  }
  io_uring_params p;
  std::memset(&p, 0, sizeof(p));
  const int fd = io_uring_setup_call(1, &p);
  if (fd < 0) return setup_refusal(errno);
  ::close(fd);
  // IORING_OP_READ came with Linux 5.6, as did this feature flag.
  if (!(p.features & IORING_FEAT_RW_CUR_POS)) return "this kernel's io_uring has no IORING_OP_READ (before Linux 5.6)";
  return "";
}

size_t io_uring_queue_depth(const std::string& path, size_t setting, std::string* why) {
  const FileHandle fh(path, false);
  return queue_depth_for(fh, setting, why);
}

void simulate_io_uring_refusal(const std::string& why) {
  std::lock_guard<std::mutex> lock(refusal_mu);
  simulated_refusal = why;
}

std::shared_ptr<const Engine> make_io_uring_engine(const EngineOptions& opts, std::string* note) {
  const std::string why = io_uring_refusal();
  if (!why.empty()) {
    *note = "io_uring -> direct: " + why;
    return make_direct_engine(opts, note);
  }
  return std::make_shared<IoUringEngine>(opts.queue_depth);
}

}  // namespace dlstore
