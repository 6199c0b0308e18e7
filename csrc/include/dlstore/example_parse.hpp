// tf.train.Example parsed straight from protobuf wire format, without protobuf or TensorFlow:
// one record into a neutral structure, or a batch of records into fixed-shape arrays.
//
//   Example   { Features features = 1; }
//   Features  { map<string, Feature> feature = 1; }   // entries: { string key = 1; Feature value = 2; }
//   Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
//                            Int64List int64_list = 3; } }
//   *List     { repeated <bytes | float | int64> value = 1; }  // numbers packed or not
//
// Protobuf's merge rules hold: a repeated feature name keeps the last entry, a list seen twice in
// one Feature is concatenated, and a later list of another kind replaces the earlier one.
// Malformed bytes throw dlstore::Error of kind Corrupt naming the byte of the record; nothing is
// allocated beyond what the record's own length bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dlstore {

enum class FeatureKind : uint8_t { None, Bytes, Float, Int64 };

const char* feature_kind_name(FeatureKind kind);

// One feature of a parsed record. Names and byte strings are views into the record, valid as
// long as the record's bytes are.
struct ParsedFeature {
  std::string_view name;
  FeatureKind kind = FeatureKind::None;
  std::vector<int64_t> int64_values;
  std::vector<float> float_values;
  std::vector<std::string_view> bytes_values;
};

struct ParsedExample {
  std::vector<ParsedFeature> features;  // in order of first appearance, names unique
};

ParsedExample parse_example(const uint8_t* data, size_t size);

// The batch path: fixed-length numeric features written into caller-owned [num_records, length]
// row-major arrays.
enum class FixedDtype : uint8_t { Int64, Int32, Float32 };  // Int32 is read from an int64_list

size_t fixed_dtype_size(FixedDtype dtype);

struct FixedFeatureSpec {
  std::string name;
  FixedDtype dtype = FixedDtype::Int64;
  size_t length = 0;
  // Without a default the feature is required; with one, a record lacking it (or holding an entry
  // with no list, as TensorFlow treats it) gets default_row: `length` values of `dtype`.
  bool has_default = false;
  std::vector<uint8_t> default_row;
};

// Record i is buffer[offsets[i], offsets[i] + lengths[i]); outputs[j] receives spec[j] and holds
// num_records * spec[j].length values. Features not in `spec` are skipped after a framing check.
// Throws Corrupt for malformed records and Generic for a record that does not match the spec;
// either way the message names the record index (and the feature when there is one).
// `first_index` is added to the record index in messages (a caller parsing part of a larger batch).
void parse_example_batch(const uint8_t* buffer, size_t buffer_size, const uint64_t* offsets,
                         const uint64_t* lengths, size_t num_records,
                         const std::vector<FixedFeatureSpec>& spec, void* const* outputs,
                         size_t first_index = 0);

// The same, with the records split into up to `threads` contiguous ranges parsed at once: the
// caller's thread takes one, a process-wide pool the others. Small batches use fewer ranges. When
// several records are bad, the one with the lowest index is reported, as the serial parse would.
void parse_example_batch_parallel(const uint8_t* buffer, size_t buffer_size, const uint64_t* offsets,
                                  const uint64_t* lengths, size_t num_records,
                                  const std::vector<FixedFeatureSpec>& spec, void* const* outputs,
                                  size_t threads);

// Where the value of bytes feature `name` lies in each record, without copying it: value i is
// buffer[value_offsets[i], value_offsets[i] + value_lengths[i]) (e.g. the JPEG of "image/encoded"
// inside the batch's own buffer). Each record must hold the feature as a bytes_list of exactly one
// value; otherwise throws (Generic, Corrupt for malformed records) naming the record index.
void locate_bytes_feature(const uint8_t* buffer, size_t buffer_size, const uint64_t* offsets,
                          const uint64_t* lengths, size_t num_records, std::string_view name,
                          uint64_t* value_offsets, uint64_t* value_lengths);

}  // namespace dlstore
