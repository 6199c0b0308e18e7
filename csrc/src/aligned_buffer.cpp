#include "dlstore/aligned_buffer.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <sys/mman.h>
#include <utility>

namespace dlstore {

AlignedBuffer::AlignedBuffer(size_t size, size_t alignment) : alignment_(alignment) { reserve(size); }

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

void AlignedBuffer::reserve(size_t size, size_t keep) {
  if (size <= size_) return;
  size_t rounded = (size + alignment_ - 1) / alignment_ * alignment_;
  void* p = nullptr;
  // Large buffers go on 2 MiB boundaries and ask for transparent huge pages: 512x fewer page
  // faults on first touch, and O_DIRECT pins a few huge pages instead of thousands of small ones.
  constexpr size_t kHuge = 2u << 20;
  const size_t align = rounded >= kHuge ? std::max(alignment_, kHuge) : alignment_;
  if (posix_memalign(&p, align, rounded) != 0) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (rounded >= kHuge) ::madvise(p, rounded / kHuge * kHuge, MADV_HUGEPAGE);
#endif
  if (keep && data_) std::memcpy(p, data_, keep < size_ ? keep : size_);
  std::free(data_);
  data_ = static_cast<uint8_t*>(p);
  size_ = rounded;
}

std::shared_ptr<BufferPool> BufferPool::shared(size_t buffer_size, size_t alignment) {
  // Readers come and go (one per epoch, or per pass over the data) and the next one wants buffers of
  // the same sizes: the pool for each size lives as long as the process, so its buffers stay warm
  // from one epoch to the next (a fresh buffer costs a page fault per page). What it keeps idle is
  // bounded (release). Leaked on purpose, like process_pool: no destructor runs at exit while a
  // reader's thread may still return a buffer.
  static std::mutex mu;
  static auto* pools = new std::map<std::pair<size_t, size_t>, std::shared_ptr<BufferPool>>();
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<BufferPool>& pool = (*pools)[{buffer_size, alignment}];
  if (!pool) pool = create(buffer_size, alignment);
  return pool;
}

std::shared_ptr<AlignedBuffer> BufferPool::acquire(size_t at_least) {
  const size_t want = std::max(buffer_size_, at_least);
  std::unique_ptr<AlignedBuffer> b;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      // The most recently released buffer that is large enough, else the last one (grown below):
      // the buffers used last are the ones still warm (in cache, and backed by the host on a VM).
      size_t pick = free_.size() - 1;
      for (size_t i = free_.size(); i-- > 0;)
        if (free_[i]->size() >= want) {
          pick = i;
          break;
        }
      b = std::move(free_[pick]);
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(pick));
    }
  }
  // Requests of varying size (batches of records) grow a buffer past the one asked for, so that the
  // next slightly larger request fits instead of growing it again.
  const size_t grown = want + want / 8;
  if (!b) {
    b.reset(new AlignedBuffer(want > buffer_size_ ? grown : want, alignment_));
    std::lock_guard<std::mutex> lock(mu_);
    ++allocated_;
  } else if (b->size() < want) {
    b->reserve(grown);
  }
  std::shared_ptr<BufferPool> self = shared_from_this();
  return std::shared_ptr<AlignedBuffer>(b.release(), [self](AlignedBuffer* p) { self->release(p); });
}

void BufferPool::release(AlignedBuffer* b) {
  // Keep enough warm buffers for a few readers' read-ahead; free the rest, so a consumer that
  // once held many batches does not leave the pool at its peak size for the process's lifetime.
  constexpr size_t kMaxFree = 64;
  constexpr size_t kMaxFreeBytes = size_t(256) << 20;
  std::unique_ptr<AlignedBuffer> owned(b);
  std::lock_guard<std::mutex> lock(mu_);
  size_t idle = owned->size();
  for (const auto& f : free_) idle += f->size();
  if (free_.size() < kMaxFree && idle <= kMaxFreeBytes) {
    free_.push_back(std::move(owned));
  } else {
    --allocated_;
  }
}

}  // namespace dlstore
