#include "dlstore/example_parse.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "dlstore/error.hpp"
#include "dlstore/thread_pool.hpp"

namespace dlstore {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "packed floats are copied as they lie on the wire (little-endian)");

namespace {

constexpr uint32_t kWireVarint = 0, kWireFixed64 = 1, kWireLengthDelimited = 2, kWireFixed32 = 5;

// What an error message needs to say where it happened.
struct RecordContext {
  const uint8_t* record = nullptr;          // byte 0 of the record
  int64_t index = -1;                       // index in the batch; -1 for a lone record
  const std::string_view* feature = nullptr;  // the feature being read, if any
};

// Record bytes may be anything: names go into messages escaped and shortened.
std::string printable(std::string_view s) {
  constexpr size_t kMax = 64;
  std::string out;
  static const char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (s.size() > kMax) out += "...";
  return out;
}

[[noreturn]] __attribute__((noinline, cold)) void fail(ErrorKind kind, const RecordContext& ctx,
                                                     const uint8_t* at, const std::string& what) {
  Text os;
  if (ctx.feature) os << "feature '" << printable(*ctx.feature) << "': ";
  if (at) os << "at byte " << (at - ctx.record) << " of the record: ";
  os << what;
  if (ctx.index >= 0) throw_record_error(kind, ctx.index, os.str());
  throw Error(kind, os.str());
}

[[noreturn]] void corrupt(const RecordContext& ctx, const uint8_t* at, const std::string& what) {
  fail(ErrorKind::Corrupt, ctx, at, what);
}

__attribute__((noinline)) uint64_t read_varint_slow(const uint8_t*& p, const uint8_t* end,
                                                    const RecordContext& ctx, const char* what) {
  const uint8_t* start = p;
  uint64_t value = 0;
  for (int i = 0; i < 10; ++i) {
    if (p >= end) corrupt(ctx, start, std::string("truncated varint (") + what + ")");
    const uint8_t b = *p++;
    value |= uint64_t(b & 0x7f) << (7 * i);
    if (b < 0x80) return value;
  }
  corrupt(ctx, start, std::string("varint longer than 10 bytes (") + what + ")");
}

inline uint64_t read_varint(const uint8_t*& p, const uint8_t* end, const RecordContext& ctx,
                            const char* what) {
  if (p < end && *p < 0x80) return *p++;
  return read_varint_slow(p, end, ctx, what);
}

// The hot loop of packed int64 lists (token ids take two or three bytes): no bounds checks while
// at least ten bytes, the longest varint, are left; the checked path near the end.
inline uint64_t read_packed_varint(const uint8_t*& p, const uint8_t* end, const RecordContext& ctx) {
  if (*p < 0x80) return *p++;
  if (end - p < 10) return read_varint_slow(p, end, ctx, "packed int64_list value");
  uint64_t value = *p & 0x7f;
  for (int i = 1; i < 10; ++i) {
    const uint64_t b = p[i];
    value |= (b & 0x7f) << (7 * i);
    if (b < 0x80) {
      p += i + 1;
      return value;
    }
  }
  corrupt(ctx, p, "varint longer than 10 bytes (packed int64_list value)");
}

struct Tag {
  uint32_t field;
  uint32_t wire;
  const uint8_t* at;  // where the tag starts, for messages
};

// Reads one protobuf message, [p, end) of a record. Copies are cheap: three pointers.
class WireCursor {
 public:
  WireCursor(const uint8_t* begin, const uint8_t* end, const RecordContext& ctx)
      : p_(begin), end_(end), ctx_(&ctx) {}

  bool done() const { return p_ >= end_; }
  const RecordContext& ctx() const { return *ctx_; }

  Tag tag(const char* message) {
    const uint8_t* at = p_;
    const uint64_t v = read_varint(p_, end_, *ctx_, message);
    const uint64_t field = v >> 3;
    if (field == 0 || field > 0x1fffffff)
      corrupt(*ctx_, at, std::string("invalid field number ") + std::to_string(field) + " in " + message);
    return Tag{static_cast<uint32_t>(field), static_cast<uint32_t>(v & 7), at};
  }

  void expect_wire(const Tag& t, uint32_t wire, const char* message) const {
    if (t.wire != wire) {
      Text os;
      os << "field " << t.field << " of " << message << " has wire type " << t.wire << ", expected "
         << wire << wire_name(wire);
      corrupt(*ctx_, t.at, os.str());
    }
  }

  // A length-delimited payload: its length is checked against what is left of this message.
  WireCursor message(const char* what) {
    const uint8_t* at = p_;
    const uint64_t n = read_varint(p_, end_, *ctx_, what);
    const auto left = static_cast<uint64_t>(end_ - p_);
    if (n > left) {
      Text os;
      os << "length " << n << " of " << what << " runs past the end of its message (" << left
         << " bytes left)";
      corrupt(*ctx_, at, os.str());
    }
    WireCursor inner(p_, p_ + n, *ctx_);
    p_ += n;
    return inner;
  }

  std::string_view bytes(const char* what) {
    const WireCursor inner = message(what);
    return {reinterpret_cast<const char*>(inner.p_), static_cast<size_t>(inner.end_ - inner.p_)};
  }

  uint64_t varint(const char* what) { return read_varint(p_, end_, *ctx_, what); }

  const uint8_t* fixed(size_t n, const char* what) {
    if (static_cast<size_t>(end_ - p_) < n)
      corrupt(*ctx_, p_, std::string("truncated ") + std::to_string(n) + "-byte " + what);
    const uint8_t* at = p_;
    p_ += n;
    return at;
  }

  // Unknown fields are skipped, as protobuf does, after checking their framing.
  void skip(const Tag& t, const char* message) {
    switch (t.wire) {
      case kWireVarint: varint(message); return;
      case kWireFixed64: fixed(8, message); return;
      case kWireLengthDelimited: this->message(message); return;
      case kWireFixed32: fixed(4, message); return;
      case 3:
      case 4:
        corrupt(*ctx_, t.at, std::string("group wire type ") + std::to_string(t.wire) + " (field " +
                                 std::to_string(t.field) + " of " + message + ") is not supported");
      default:
        corrupt(*ctx_, t.at, std::string("invalid wire type ") + std::to_string(t.wire) + " (field " +
                                 std::to_string(t.field) + " of " + message + ")");
    }
  }

  const uint8_t* pos() const { return p_; }
  const uint8_t* end() const { return end_; }

 private:
  static const char* wire_name(uint32_t wire) {
    switch (wire) {
      case kWireVarint: return " (varint)";
      case kWireLengthDelimited: return " (length-delimited)";
      case kWireFixed32: return " (fixed32)";
      default: return "";
    }
  }

  const uint8_t* p_;
  const uint8_t* end_;
  const RecordContext* ctx_;
};

// Calls on_entry(entry cursor) for each map entry of the record's Features.
template <class OnEntry>
void for_each_entry(WireCursor example, OnEntry&& on_entry) {
  while (!example.done()) {
    const Tag t = example.tag("Example");
    if (t.field != 1) {
      example.skip(t, "Example");
      continue;
    }
    example.expect_wire(t, kWireLengthDelimited, "Example");
    WireCursor features = example.message("Example.features");
    while (!features.done()) {
      const Tag f = features.tag("Features");
      if (f.field != 1) {
        features.skip(f, "Features");
        continue;
      }
      features.expect_wire(f, kWireLengthDelimited, "Features");
      on_entry(features.message("a feature map entry"));
    }
  }
}

// An entry's key; checks the framing of all its fields. A map entry may put its value before its
// key, so the key is found first and the values read in a second pass (for_each_value).
std::string_view entry_key(WireCursor entry) {
  std::string_view key;
  while (!entry.done()) {
    const Tag t = entry.tag("a feature map entry");
    if (t.field == 1 || t.field == 2) {
      entry.expect_wire(t, kWireLengthDelimited, "a feature map entry");
      const std::string_view payload = entry.bytes(t.field == 1 ? "a feature name" : "a Feature");
      if (t.field == 1) key = payload;
    } else {
      entry.skip(t, "a feature map entry");
    }
  }
  return key;
}

// Calls on_list(kind, list cursor) for every list in every Feature of the entry, in wire order.
template <class OnList>
void for_each_list(WireCursor entry, OnList&& on_list) {
  while (!entry.done()) {
    const Tag t = entry.tag("a feature map entry");
    if (t.field != 2) {
      entry.skip(t, "a feature map entry");
      continue;
    }
    WireCursor feature = entry.message("a Feature");
    while (!feature.done()) {
      const Tag f = feature.tag("Feature");
      if (f.field < 1 || f.field > 3) {
        feature.skip(f, "Feature");
        continue;
      }
      feature.expect_wire(f, kWireLengthDelimited, "Feature");
      const auto kind = static_cast<FeatureKind>(f.field);  // bytes_list = 1, float_list = 2, int64_list = 3
      on_list(kind, feature.message(feature_kind_name(kind)));
    }
  }
}

// Value decoders: sink(value, where) is called once per value, in order.
template <class Sink>
void for_each_int64(WireCursor list, Sink&& sink) {
  const RecordContext& ctx = list.ctx();
  while (!list.done()) {
    const Tag t = list.tag("int64_list");
    if (t.field != 1) {
      list.skip(t, "int64_list");
      continue;
    }
    if (t.wire == kWireVarint) {
      const uint8_t* at = list.pos();
      sink(static_cast<int64_t>(list.varint("int64_list value")), at);
      continue;
    }
    list.expect_wire(t, kWireLengthDelimited, "int64_list");
    const WireCursor packed = list.message("packed int64_list");
    const uint8_t* p = packed.pos();
    const uint8_t* end = packed.end();
    while (p < end) {
      const uint8_t* at = p;
      sink(static_cast<int64_t>(read_packed_varint(p, end, ctx)), at);
    }
  }
}

template <class Sink>
void for_each_float(WireCursor list, Sink&& sink) {
  while (!list.done()) {
    const Tag t = list.tag("float_list");
    if (t.field != 1) {
      list.skip(t, "float_list");
      continue;
    }
    if (t.wire == kWireFixed32) {
      float v;
      std::memcpy(&v, list.fixed(4, "float_list value"), 4);
      sink(v);
      continue;
    }
    list.expect_wire(t, kWireLengthDelimited, "float_list");
    const uint8_t* at = list.pos();
    const WireCursor packed = list.message("packed float_list");
    const auto n = static_cast<size_t>(packed.end() - packed.pos());
    if (n % 4 != 0)
      corrupt(list.ctx(), at, "packed float_list of " + std::to_string(n) + " bytes is not a multiple of 4");
    for (const uint8_t* p = packed.pos(); p < packed.end(); p += 4) {
      float v;
      std::memcpy(&v, p, 4);
      sink(v);
    }
  }
}

template <class Sink>
void for_each_bytes(WireCursor list, Sink&& sink) {
  while (!list.done()) {
    const Tag t = list.tag("bytes_list");
    if (t.field != 1) {
      list.skip(t, "bytes_list");
      continue;
    }
    list.expect_wire(t, kWireLengthDelimited, "bytes_list");
    sink(list.bytes("bytes_list value"));
  }
}

}  // namespace

const char* feature_kind_name(FeatureKind kind) {
  switch (kind) {
    case FeatureKind::Bytes: return "bytes_list";
    case FeatureKind::Float: return "float_list";
    case FeatureKind::Int64: return "int64_list";
    default: return "no list";
  }
}

size_t fixed_dtype_size(FixedDtype dtype) {
  return dtype == FixedDtype::Int32 || dtype == FixedDtype::Float32 ? 4 : 8;
}

ParsedExample parse_example(const uint8_t* data, size_t size) {
  RecordContext ctx;
  ctx.record = data;
  ParsedExample out;
  // Not the hot path; the map keeps a record with many repeated names from going quadratic.
  std::unordered_map<std::string_view, size_t> by_name;
  for_each_entry(WireCursor(data, data + size, ctx), [&](WireCursor entry) {
    const std::string_view name = entry_key(entry);
    auto [it, inserted] = by_name.emplace(name, out.features.size());
    if (inserted) out.features.emplace_back();
    ParsedFeature& f = out.features[it->second];
    f = ParsedFeature{};  // a repeated name: the last entry wins
    f.name = name;
    ctx.feature = &name;
    for_each_list(entry, [&](FeatureKind kind, WireCursor list) {
      if (kind != f.kind) {  // a later list of another kind replaces the earlier one (oneof)
        f.int64_values.clear();
        f.float_values.clear();
        f.bytes_values.clear();
        f.kind = kind;
      }
      switch (kind) {
        case FeatureKind::Int64:
          for_each_int64(list, [&](int64_t v, const uint8_t*) { f.int64_values.push_back(v); });
          break;
        case FeatureKind::Float:
          for_each_float(list, [&](float v) { f.float_values.push_back(v); });
          break;
        default:
          for_each_bytes(list, [&](std::string_view v) { f.bytes_values.push_back(v); });
          break;
      }
    });
    ctx.feature = nullptr;
  });
  return out;
}

namespace {

struct BatchFeatureState {
  bool seen = false;
  FeatureKind kind = FeatureKind::None;
  size_t count = 0;  // values of `kind` seen; only the first `length` are written
};

FeatureKind kind_for(FixedDtype dtype) {
  return dtype == FixedDtype::Float32 ? FeatureKind::Float : FeatureKind::Int64;
}

const char* dtype_name(FixedDtype dtype) {
  switch (dtype) {
    case FixedDtype::Int64: return "int64";
    case FixedDtype::Int32: return "int32";
    default: return "float32";
  }
}

// Index of `name` in spec, or spec.size(). Records usually list features in the same order, so the
// search starts after the previous match and typically succeeds on the first comparison.
size_t match_feature(std::string_view name, const std::vector<FixedFeatureSpec>& spec, size_t& hint) {
  const size_t n = spec.size();
  for (size_t k = 0, j = hint; k < n; ++k, j = (j + 1 == n ? 0 : j + 1)) {
    const std::string& s = spec[j].name;
    if (s.size() == name.size() && std::memcmp(s.data(), name.data(), name.size()) == 0) {
      hint = j + 1 == n ? 0 : j + 1;
      return j;
    }
  }
  return n;
}

// Appends one list to the feature's row: values past `length` are counted, not written.
void write_list(FeatureKind kind, WireCursor list, const FixedFeatureSpec& spec, void* row,
                BatchFeatureState& st) {
  const size_t cap = spec.length;
  // A local count: stores into an int64 row could alias st.count and force it through memory.
  size_t count = st.count;
  if (kind != kind_for(spec.dtype)) {  // the wrong kind: only checked, reported at the end of the record
    switch (kind) {
      case FeatureKind::Int64: for_each_int64(list, [&](int64_t, const uint8_t*) { ++count; }); break;
      case FeatureKind::Float: for_each_float(list, [&](float) { ++count; }); break;
      default: for_each_bytes(list, [&](std::string_view) { ++count; }); break;
    }
  } else if (spec.dtype == FixedDtype::Int64) {
    auto* out = static_cast<int64_t*>(row);
    for_each_int64(list, [&](int64_t v, const uint8_t*) {
      if (count < cap) out[count] = v;
      ++count;
    });
  } else if (spec.dtype == FixedDtype::Int32) {
    auto* out = static_cast<int32_t*>(row);
    for_each_int64(list, [&](int64_t v, const uint8_t* at) {
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
        fail(ErrorKind::Generic, list.ctx(), at, "value " + std::to_string(v) + " does not fit in int32");
      if (count < cap) out[count] = static_cast<int32_t>(v);
      ++count;
    });
  } else {
    auto* out = static_cast<float*>(row);
    for_each_float(list, [&](float v) {
      if (count < cap) out[count] = v;
      ++count;
    });
  }
  st.count = count;
}

void check_spec(const std::vector<FixedFeatureSpec>& spec) {
  for (size_t j = 0; j < spec.size(); ++j) {
    const FixedFeatureSpec& s = spec[j];
    if (s.has_default && s.default_row.size() != s.length * fixed_dtype_size(s.dtype))
      throw Error(ErrorKind::Generic, "feature '" + printable(s.name) + "': default of " +
                                          std::to_string(s.default_row.size()) + " bytes, expected " +
                                          std::to_string(s.length) + " " + dtype_name(s.dtype) + " values");
    for (size_t k = 0; k < j; ++k)
      if (spec[k].name == s.name)
        throw Error(ErrorKind::Generic, "feature '" + printable(s.name) + "' appears twice in the spec");
  }
}

}  // namespace

void parse_example_batch(const uint8_t* buffer, size_t buffer_size, const uint64_t* offsets,
                         const uint64_t* lengths, size_t num_records,
                         const std::vector<FixedFeatureSpec>& spec, void* const* outputs,
                         size_t first_index) {
  check_spec(spec);
  std::vector<BatchFeatureState> states(spec.size());
  size_t hint = 0;
  for (size_t i = 0; i < num_records; ++i) {
    if (offsets[i] > buffer_size || lengths[i] > buffer_size - offsets[i]) {
      Text os;
      os << "(offset " << offsets[i] << ", length " << lengths[i] << ") lies outside the buffer of "
         << buffer_size << " bytes";
      throw_record_error(ErrorKind::Generic, static_cast<int64_t>(first_index + i), os.str());
    }
    const uint8_t* record = buffer + offsets[i];
    RecordContext ctx;
    ctx.record = record;
    ctx.index = static_cast<int64_t>(first_index + i);
    for (BatchFeatureState& st : states) st = BatchFeatureState{};

    for_each_entry(WireCursor(record, record + lengths[i], ctx), [&](WireCursor entry) {
      std::string_view name = entry_key(entry);
      const size_t j = match_feature(name, spec, hint);
      if (j == spec.size()) return;  // not asked for: its framing was checked by entry_key
      const FixedFeatureSpec& s = spec[j];
      void* row = static_cast<uint8_t*>(outputs[j]) + i * s.length * fixed_dtype_size(s.dtype);
      BatchFeatureState& st = states[j];
      st = BatchFeatureState{};  // a repeated name: the last entry wins
      st.seen = true;
      ctx.feature = &name;
      for_each_list(entry, [&](FeatureKind kind, WireCursor list) {
        if (kind != st.kind) {  // a later list of another kind replaces the earlier one (oneof)
          st.kind = kind;
          st.count = 0;
        }
        write_list(kind, list, s, row, st);
      });
      ctx.feature = nullptr;
    });

    for (size_t j = 0; j < spec.size(); ++j) {
      const FixedFeatureSpec& s = spec[j];
      const BatchFeatureState& st = states[j];
      const std::string_view name(s.name);
      ctx.feature = &name;
      // As TensorFlow does, an entry whose Feature holds no list counts as missing.
      if (!st.seen || st.kind == FeatureKind::None) {
        if (!s.has_default)
          fail(ErrorKind::Generic, ctx, nullptr,
               std::string(st.seen ? "has no value list" : "missing") + ", and the spec gives no default");
        if (!s.default_row.empty())  // memcpy from an empty vector's null data() is undefined
          std::memcpy(static_cast<uint8_t*>(outputs[j]) + i * s.default_row.size(), s.default_row.data(),
                      s.default_row.size());
        continue;
      }
      const FeatureKind want = kind_for(s.dtype);
      if (st.kind != want)
        fail(ErrorKind::Generic, ctx, nullptr,
             std::string("is a ") + feature_kind_name(st.kind) + ", expected " + feature_kind_name(want) +
                 " for " + dtype_name(s.dtype));
      if (st.count != s.length)
        fail(ErrorKind::Generic, ctx, nullptr,
             "has " + std::to_string(st.count) + " values, expected " + std::to_string(s.length));
    }
  }
}

namespace {

// Records per range below which splitting a batch costs more in hand-offs than it saves.
constexpr size_t kMinRecordsPerRange = 16;

}  // namespace

void parse_example_batch_parallel(const uint8_t* buffer, size_t buffer_size, const uint64_t* offsets,
                                  const uint64_t* lengths, size_t num_records,
                                  const std::vector<FixedFeatureSpec>& spec, void* const* outputs,
                                  size_t threads) {
  const size_t ranges = std::max<size_t>(1, std::min(threads, num_records / kMinRecordsPerRange));
  if (ranges <= 1) {
    parse_example_batch(buffer, buffer_size, offsets, lengths, num_records, spec, outputs);
    return;
  }
  check_spec(spec);  // once here, so that a bad spec is reported once and not per range
  auto parse_range = [&](size_t r) {
    const size_t begin = num_records * r / ranges, end = num_records * (r + 1) / ranges;
    std::vector<void*> shifted(spec.size());
    for (size_t j = 0; j < spec.size(); ++j)
      shifted[j] = static_cast<uint8_t*>(outputs[j]) + begin * spec[j].length * fixed_dtype_size(spec[j].dtype);
    parse_example_batch(buffer, buffer_size, offsets + begin, lengths + begin, end - begin, spec,
                        shifted.data(), begin);
  };
  const std::shared_ptr<ThreadPool> pool = process_pool(ranges - 1);
  std::vector<std::future<void>> others;
  others.reserve(ranges - 1);
  for (size_t r = 1; r < ranges; ++r) others.push_back(pool->submit([&parse_range, r] { parse_range(r); }));
  // Every range must finish before returning (they write into outputs and read spec), errors or not.
  std::exception_ptr first;
  try {
    parse_range(0);
  } catch (...) {
    first = std::current_exception();
  }
  for (std::future<void>& f : others) {
    try {
      f.get();
    } catch (...) {
      if (!first) first = std::current_exception();  // ranges are in record order: keep the lowest
    }
  }
  if (first) std::rethrow_exception(first);
}

void locate_bytes_feature(const uint8_t* buffer, size_t buffer_size, const uint64_t* offsets,
                          const uint64_t* lengths, size_t num_records, std::string_view name,
                          uint64_t* value_offsets, uint64_t* value_lengths) {
  for (size_t i = 0; i < num_records; ++i) {
    if (offsets[i] > buffer_size || lengths[i] > buffer_size - offsets[i]) {
      Text os;
      os << "(offset " << offsets[i] << ", length " << lengths[i] << ") lies outside the buffer of "
         << buffer_size << " bytes";
      throw_record_error(ErrorKind::Generic, static_cast<int64_t>(i), os.str());
    }
    const uint8_t* record = buffer + offsets[i];
    RecordContext ctx;
    ctx.record = record;
    ctx.index = static_cast<int64_t>(i);
    // The merge rules of parse_example: the last entry of the name wins, a list of another kind
    // replaces the earlier ones, lists of the same kind add up.
    bool seen = false;
    FeatureKind kind = FeatureKind::None;
    size_t count = 0;
    std::string_view value;
    for_each_entry(WireCursor(record, record + lengths[i], ctx), [&](WireCursor entry) {
      const std::string_view key = entry_key(entry);
      if (key != name) return;
      seen = true;
      kind = FeatureKind::None;
      count = 0;
      for_each_list(entry, [&](FeatureKind k, WireCursor list) {
        if (k != kind) {
          kind = k;
          count = 0;
        }
        if (k == FeatureKind::Bytes) {
          for_each_bytes(list, [&](std::string_view v) {
            if (count++ == 0) value = v;
          });
        }
      });
    });
    const std::string_view feature(name);
    ctx.feature = &feature;
    if (!seen) fail(ErrorKind::Generic, ctx, nullptr, "missing");
    if (kind == FeatureKind::None) fail(ErrorKind::Generic, ctx, nullptr, "has no value list");
    if (kind != FeatureKind::Bytes)
      fail(ErrorKind::Generic, ctx, nullptr, std::string("is a ") + feature_kind_name(kind) + ", expected bytes_list");
    if (count != 1)
      fail(ErrorKind::Generic, ctx, nullptr, "has " + std::to_string(count) + " values, expected 1");
    value_offsets[i] = static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(value.data()) - buffer);
    value_lengths[i] = value.size();
  }
}

}  // namespace dlstore
