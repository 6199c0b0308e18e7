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
  // Readers come and go (one per pass over the data); their buffers stay warm in a pool kept per
  // size while any reader or batch uses it.
  static std::mutex mu;
  static std::map<std::pair<size_t, size_t>, std::weak_ptr<BufferPool>> pools;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = pools[{buffer_size, alignment}];
  std::shared_ptr<BufferPool> pool = slot.lock();
  if (!pool) {
    pool = create(buffer_size, alignment);
    slot = pool;
  }
  return pool;
}

std::shared_ptr<AlignedBuffer> BufferPool::acquire(size_t at_least) {
  const size_t want = std::max(buffer_size_, at_least);
  std::unique_ptr<AlignedBuffer> b;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      // A free buffer that is large enough, else the last one (grown below).
      size_t pick = free_.size() - 1;
      for (size_t i = 0; i < free_.size(); ++i)
        if (free_[i]->size() >= want) {
          pick = i;
          break;
        }
      b = std::move(free_[pick]);
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(pick));
    }
  }
  if (!b) {
    b.reset(new AlignedBuffer(want, alignment_));
    std::lock_guard<std::mutex> lock(mu_);
    ++allocated_;
  } else if (b->size() < want) {
    b->reserve(want);
  }
  std::shared_ptr<BufferPool> self = shared_from_this();
  return std::shared_ptr<AlignedBuffer>(b.release(), [self](AlignedBuffer* p) { self->release(p); });
}

void BufferPool::release(AlignedBuffer* b) {
  // Keep enough warm buffers for a few readers' read-ahead; free the rest, so a consumer that
  // once held many batches does not leave the pool at its peak size for the process's lifetime.
  constexpr size_t kMaxFree = 16;
  std::unique_ptr<AlignedBuffer> owned(b);
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.size() < kMaxFree) {
    free_.push_back(std::move(owned));
  } else {
    --allocated_;
  }
}

}  // namespace dlstore
