#include "dlstore/file_handle.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fcntl.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <vector>

#include "dlstore/error.hpp"

namespace dlstore {

// Defined in dio_align.cpp: it needs <linux/stat.h>, which clashes with <sys/stat.h>.
bool statx_dio_alignment(int fd, uint32_t* mem_align, uint32_t* offset_align);

FileHandle::FileHandle(const std::string& path, bool direct) : path_(path), direct_(direct) {
  int flags = O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0);
  fd_ = ::open(path.c_str(), flags);
  if (fd_ < 0) {
    int err = errno;
    if (direct && err == EINVAL)
      throw_error(ErrorKind::Alignment, path, -1, "the filesystem refuses O_DIRECT (EINVAL on open)");
    throw_errno(path, -1, "open", err);
  }
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;  // close() below may change errno
    ::close(fd_);
    fd_ = -1;
    throw_errno(path, -1, "fstat", err);
  }
  size_ = static_cast<uint64_t>(st.st_size);
  mtime_ns_ = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
  dev_ = static_cast<uint64_t>(st.st_dev);
  ino_ = static_cast<uint64_t>(st.st_ino);
}

FileHandle::~FileHandle() {
  if (fd_ >= 0) ::close(fd_);
}

FileHandle::FileHandle(FileHandle&& o) noexcept { *this = std::move(o); }

FileHandle& FileHandle::operator=(FileHandle&& o) noexcept {
  std::swap(fd_, o.fd_);
  std::swap(path_, o.path_);
  std::swap(size_, o.size_);
  std::swap(mtime_ns_, o.mtime_ns_);
  std::swap(dev_, o.dev_);
  std::swap(ino_, o.ino_);
  std::swap(direct_, o.direct_);
  return *this;
}

size_t FileHandle::pread_full(void* dst, size_t n, uint64_t offset) const {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd_, static_cast<uint8_t*>(dst) + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      // A device error fails the whole read (O_DIRECT above all), which would name only where it began:
      // read again in pieces up to the first that fails, and name that one.
      constexpr size_t kPiece = 64u << 10;  // a multiple of every direct-I/O alignment accepted
      size_t at = got;
      if (err == EIO && n - got > kPiece) {
        while (at < n) {
          const ssize_t p = ::pread(fd_, static_cast<uint8_t*>(dst) + at, std::min(kPiece, n - at),
                                    static_cast<off_t>(offset + at));
          if (p < 0 && errno == EINTR) continue;
          if (p <= 0) break;
          at += static_cast<size_t>(p);
          if (direct_ && (at % 512) != 0) break;
        }
      }
      throw_errno(path_, static_cast<int64_t>(offset + at),
                  "pread of " + std::to_string(n - got) + " bytes" +
                      (at > got ? " (read again in 64 KiB pieces: the one at this byte is the first that fails)" : ""),
                  err);
    }
    if (r == 0) break;  // end of file
    got += static_cast<size_t>(r);
    // O_DIRECT continues only from an aligned position; an unaligned short read means end of file.
    if (direct_ && (got % 512) != 0) break;
  }
  return got;
}

// A number from the block device's queue/ directory in sysfs, 0 when there is none (tmpfs, NFS, an
// overlay). /sys/dev/block/M:m is the partition or the disk; a partition's queue/ lives on its parent.
static uint32_t block_queue_value(dev_t dev, const char* name) {
  const std::string base = "/sys/dev/block/" + std::to_string(major(dev)) + ":" + std::to_string(minor(dev));
  for (const char* rel : {"/queue/", "/../queue/"}) {
    const int fd = ::open((base + rel + name).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char text[32] = {};
    const ssize_t n = ::read(fd, text, sizeof text - 1);
    ::close(fd);
    if (n <= 0) continue;
    char* end = nullptr;
    const unsigned long v = std::strtoul(text, &end, 10);  // no iostreams in the core (dlstore/text.hpp)
    if (end != text && v > 0 && v <= UINT32_MAX) return static_cast<uint32_t>(v);
  }
  return 0;
}

static uint32_t logical_block_size(dev_t dev) { return block_queue_value(dev, "logical_block_size"); }

bool FileHandle::same_file(const FileHandle& other) const { return dev_ == other.dev_ && ino_ == other.ino_; }

uint32_t FileHandle::device_requests() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return 0;
  return block_queue_value(st.st_dev, "nr_requests");
}

DirectAlignment FileHandle::direct_alignment() const {
  DirectAlignment a;
  uint32_t mem = 0, off = 0;
  if (statx_dio_alignment(fd_, &mem, &off)) {
    a.source = "statx(STATX_DIOALIGN)";
    if (mem == 0 || off == 0) {
      // The filesystem says this file cannot do direct I/O (data journalling, encryption,
      // verity...): O_DIRECT would silently be buffered or fail with EINVAL.
      a.supported = false;
      return a;
    }
    a.memory = mem;
    a.offset = off;
    return a;
  }
  struct stat st;
  if (::fstat(fd_, &st) == 0) {
    if (uint32_t lbs = logical_block_size(st.st_dev)) {
      a.memory = lbs;
      a.offset = lbs;
      a.source = "logical block size";
      return a;
    }
  }
  a.source = "default 4096";
  return a;
}

// cachestat(2), Linux 6.5+: the page cache's state of a file's range in one call, with no mapping (mmap and
// munmap take the process's mmap lock, which a pipeline's other threads need for their page faults). The
// headers of older systems lack it; the number is the same on every architecture.
namespace {
constexpr long kCachestat = 451;
struct CachestatRange {
  uint64_t off, len;
};
struct Cachestat {
  uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};
std::atomic<bool> cachestat_missing{false};  // ENOSYS once: mincore from then on

// Whether mincore tells this process the truth about the file open as `fd`. The kernel (since 5.0) answers
// only for a file the process owns or may write, or with CAP_FOWNER, as cachestat does; for any other
// file it reports every page resident, cached or not. Write access is asked as access(2) sees it, so a
// read-only mount counts as no access (the kernel may answer there: such a file's reads go to the device).
bool mincore_tells(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return false;
  if (st.st_uid == ::geteuid()) return true;  // the kernel compares the fsuid, which follows the euid
  __user_cap_header_struct head{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct caps[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capget, &head, caps) == 0 && (caps[CAP_FOWNER / 32].effective & (1u << (CAP_FOWNER % 32))) != 0)
    return true;
  return ::faccessat(AT_FDCWD, ("/proc/self/fd/" + std::to_string(fd)).c_str(), W_OK, AT_EACCESS) == 0;
}
}  // namespace

bool page_cache_tells(int fd) {
  if (!cachestat_missing.load(std::memory_order_relaxed)) {
    CachestatRange range{0, 1};
    Cachestat cs{};
    if (::syscall(kCachestat, fd, &range, &cs, 0) == 0) return true;
    if (errno != ENOSYS) return false;  // EPERM: not for this process
    cachestat_missing.store(true, std::memory_order_relaxed);
  }
  return mincore_tells(fd);
}

int64_t cached_pages(int fd, uint64_t offset, uint64_t n, CacheProbe how, uint64_t* pages, bool told) {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  *pages = 0;
  if (n == 0) return 0;
  const uint64_t first = offset / page, last = (offset + n - 1) / page;
  *pages = last - first + 1;
  if (how == CacheProbe::Cachestat || (how == CacheProbe::Auto && !cachestat_missing.load(std::memory_order_relaxed))) {
    CachestatRange range{offset, n};
    Cachestat cs{};
    if (::syscall(kCachestat, fd, &range, &cs, 0) == 0) return static_cast<int64_t>(cs.nr_cache);
    // EPERM: the kernel keeps this file's cache state from this process (mincore would say every page is held).
    if (errno != ENOSYS || how == CacheProbe::Cachestat) return -1;
    cachestat_missing.store(true, std::memory_order_relaxed);
  }
  if (!told && !mincore_tells(fd)) return -1;
  const uint64_t start = first * page;
  const size_t len = static_cast<size_t>(offset + n - start);
  void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
  if (p == MAP_FAILED) return -1;
  unsigned char small[256];
  std::vector<unsigned char> large;
  unsigned char* vec = small;
  if (*pages > sizeof small) {
    large.resize(static_cast<size_t>(*pages));
    vec = large.data();
  }
  int64_t held = -1;
  if (::mincore(p, len, vec) == 0) {
    held = 0;
    for (uint64_t i = 0; i < *pages; ++i) held += vec[i] & 1;
  }
  ::munmap(p, len);
  return held;
}

bool page_cache_holds(int fd, uint64_t offset, size_t n, CacheProbe how, bool told) {
  uint64_t pages = 0;
  return n > 0 && cached_pages(fd, offset, n, how, &pages, told) == static_cast<int64_t>(pages);
}

Mapping::Mapping(const std::string& path, bool sequential) : path_(path) {
  FileHandle fh(path, false);
  size_ = fh.size();
  if (size_ == 0) return;  // mmap of length 0 fails; an empty file is simply empty
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fh.fd(), 0);
  if (p == MAP_FAILED) throw_errno(path, 0, "mmap", errno);
  data_ = static_cast<uint8_t*>(p);
  if (sequential) ::madvise(data_, size_, MADV_SEQUENTIAL);
}

Mapping::~Mapping() {
  if (data_) ::munmap(data_, size_);
}

void Mapping::populate(uint64_t offset, size_t n) const {
  if (!data_ || offset >= size_) return;
  if (offset + n > size_) n = size_ - offset;
  const long page = ::sysconf(_SC_PAGESIZE);
  uint64_t start = offset / page * page;
  size_t len = n + (offset - start);
#ifdef MADV_POPULATE_READ
  if (::madvise(data_ + start, len, MADV_POPULATE_READ) == 0) return;
  if (errno == EFAULT) lost(offset, n);  // past the end of the file: it shrank since it was mapped
  if (errno == EIO) throw_errno(path_, static_cast<int64_t>(offset), "madvise(MADV_POPULATE_READ)", errno);
#endif
  volatile uint8_t sink = 0;
  for (uint64_t p = start; p < start + len; p += page) sink ^= data_[p];
  (void)sink;
}

void Mapping::expect_holds(uint64_t offset, size_t n) const {
  if (!data_ || n == 0) return;
#ifdef MADV_POPULATE_READ
  const long page = ::sysconf(_SC_PAGESIZE);
  const uint64_t last = (offset + n - 1) / page * page;
  if (last >= size_) return;  // past the mapping: the reads' own bounds checks say so
  if (::madvise(data_ + last, 1, MADV_POPULATE_READ) != 0 && errno == EFAULT) lost(offset, n);
#endif
}

void Mapping::lost(uint64_t offset, size_t n) const {
  // MADV_POPULATE_READ fails with EFAULT for pages past the file's end and for pages the device could not
  // read (EIO under the mapping). The first page that fails says where; the file's size now says which.
  uint64_t bad = offset;
#ifdef MADV_POPULATE_READ
  const long page = ::sysconf(_SC_PAGESIZE);
  for (uint64_t p = offset / page * page; p < offset + n; p += page) {
    if (::madvise(data_ + p, 1, MADV_POPULATE_READ) != 0 && errno == EFAULT) {
      bad = std::max<uint64_t>(p, offset);
      break;
    }
  }
#endif
  struct stat st;
  if (::stat(path_.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) >= offset + n)
    throw_errno(path_, static_cast<int64_t>(bad),
                "reading its mapping (the file still holds bytes " + std::to_string(offset) + ".." +
                    std::to_string(offset + n) + ", so the device could not read them)",
                EIO);
  throw_error(ErrorKind::Io, path_, static_cast<int64_t>(bad),
              "the file shrank while being read (truncated or rewritten in place): bytes " + std::to_string(bad) +
                  ".." + std::to_string(offset + n) + " of its mapping are gone");
}

}  // namespace dlstore
