#include "dlstore/reader.hpp"

#include <algorithm>

#include "dlstore/error.hpp"

namespace dlstore {

Reader::Reader(std::vector<std::string> paths, ReaderOptions opts)
    : paths_(std::make_shared<const std::vector<std::string>>(std::move(paths))) {
  chunks_.reset(new ChunkReader(*paths_, opts.engine, opts.headroom, opts.ranges));
  ChunkStream* stream = chunks_.get();
  bool any_compressed = std::any_of(opts.compression.begin(), opts.compression.end(),
                                    [](Compression c) { return c != Compression::None; });
  if (any_compressed) {
    // A compressed file is one deflate stream: it can only be read from its start.
    for (const ByteRange& r : opts.ranges)
      DLSTORE_EXPECT(r.start == 0 && r.end == kUnknownSize, Generic, "", -1,
                     "byte ranges cannot be read from compressed files; read them whole");
    opts.compression.resize(paths_->size(), Compression::None);
    inflate_.reset(new InflateStream(*chunks_, opts.compression, *paths_, chunks_->pool(),
                                     chunks_->headroom()));
    stream = inflate_.get();
  }
  scanner_.reset(new RecordScanner(*stream, paths_, opts.scan));
  publish();  // the engine's notes (io_uring refused) are there before the first read
}

bool Reader::next_batch(RecordBatch& out) {
  PublishOnExit<Reader> on_exit{*this};
  return scanner_->next_batch(out);
}

void Reader::publish() noexcept {
  try {
    report_.publish(live_stats(), chunks_->note_count(), [this] { return chunks_->notes(); },
                    scanner_->stats().corruptions);
  } catch (...) {  // out of memory building the notes: the last report stands
  }
}

ReaderStats Reader::live_stats() const {
  ReaderStats s;
  const ScanStats& sc = scanner_->stats();
  s.records = sc.records;
  s.payload_bytes = sc.payload_bytes;
  s.skipped = sc.skipped;
  s.moved_bytes = sc.moved_bytes;
  s.spilled_records = sc.spilled_records;
  s.file_bytes_read = chunks_->bytes_read();
  s.cache_bytes_read = chunks_->cache_bytes_read();
  s.buffers_allocated = chunks_->pool()->allocated();
  return s;
}

}  // namespace dlstore
