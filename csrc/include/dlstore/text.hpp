// Text: builds error messages with `<<` and no iostreams.
//
// The C++ core formats no text through <sstream>: on the GPU machine, whose Python builds extensions with
// /opt/gcc's g++, `ostream << long` compiled into the extension crashed the process on the first message
// (a corrupt record); most likely those headers do not match the libstdc++ the process loads. Integers go
// through std::to_string, floating point through snprintf("%g"), as a default ostream would print them.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>

namespace dlstore {

class Text {
 public:
  Text& operator<<(std::string_view s) {
    s_.append(s.data(), s.size());
    return *this;
  }
  Text& operator<<(const std::string& s) { return *this << std::string_view(s); }
  Text& operator<<(const char* s) { return *this << std::string_view(s); }
  Text& operator<<(char c) {
    s_ += c;
    return *this;
  }
  template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, char>, int> = 0>
  Text& operator<<(T v) {
    if constexpr (std::is_same_v<T, bool>) {
      s_ += v ? '1' : '0';
    } else if constexpr (sizeof(T) == 1) {  // int8_t and uint8_t print as numbers, not as characters
      s_ += std::to_string(static_cast<int>(v));
    } else {
      s_ += std::to_string(v);
    }
    return *this;
  }
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Text& operator<<(T v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", static_cast<double>(v));
    s_ += b;
    return *this;
  }
  const std::string& str() const { return s_; }

 private:
  std::string s_;
};

}  // namespace dlstore
