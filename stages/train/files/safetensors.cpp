// safetensors files read and written (weight_files.hpp), with a JSON reader just large enough
// for their header: every size and offset is checked before it is used.
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "graph/error.hpp"
#include "stages/train/files/weight_files.hpp"

namespace flowtrain::train {

namespace {

// ---------------------------------------------------------------------------------------------
// safetensors: an 8-byte little-endian header length, a JSON header
// {name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data; offsets count from the data's start.

constexpr std::pair<const char*, torch::ScalarType> kSafetensorsDtypes[] = {
    {"F64", torch::kDouble}, {"F32", torch::kFloat},  {"F16", torch::kHalf},
    {"BF16", torch::kBFloat16}, {"I64", torch::kLong}, {"I32", torch::kInt},
    {"I16", torch::kShort},  {"I8", torch::kChar},    {"U8", torch::kByte},
    {"BOOL", torch::kBool},
};
// Headers above this are not weights files (safetensors itself caps them at 100 MB).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

// A JSON value: enough of JSON for a safetensors header.
struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  bool boolean = false;
  std::int64_t integer = 0;
  bool is_integer = false;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;
};

class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  Json parse() {
    Json value = parse_value(0);
    skip_space();
    if (at_ != text_.size()) fail("text after the header's JSON object");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(path_ + ": damaged safetensors header (" + what + " at byte " +
                std::to_string(8 + at_) + ")");
  }
  void skip_space() {
    while (at_ < text_.size() && std::strchr(" \t\r\n", text_[at_]) && text_[at_] != '\0') ++at_;
  }
  char peek() {
    skip_space();
    if (at_ >= text_.size()) fail("unexpected end");
    return text_[at_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++at_;
  }

  Json parse_value(int depth) {
    if (depth > 8) fail("nesting too deep");
    Json value;
    const char c = peek();
    if (c == '{') {
      value.kind = Json::Kind::kObject;
      ++at_;
      if (peek() == '}') {
        ++at_;
        return value;
      }
      while (true) {
        if (peek() != '"') fail("expected a key");
        std::string key = parse_string();
        expect(':');
        value.object.emplace_back(std::move(key), parse_value(depth + 1));
        if (peek() == ',') {
          ++at_;
          continue;
        }
        expect('}');
        return value;
      }
    }
    if (c == '[') {
      value.kind = Json::Kind::kArray;
      ++at_;
      if (peek() == ']') {
        ++at_;
        return value;
      }
      while (true) {
        value.array.push_back(parse_value(depth + 1));
        if (peek() == ',') {
          ++at_;
          continue;
        }
        expect(']');
        return value;
      }
    }
    if (c == '"') {
      value.kind = Json::Kind::kString;
      value.string = parse_string();
      return value;
    }
    for (const auto& [word, kind, flag] : {std::tuple{"true", Json::Kind::kBool, true},
                                           std::tuple{"false", Json::Kind::kBool, false},
                                           std::tuple{"null", Json::Kind::kNull, false}}) {
      if (text_.substr(at_, std::strlen(word)) == word) {
        at_ += std::strlen(word);
        value.kind = kind;
        value.boolean = flag;
        return value;
      }
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    fail("unexpected character");
  }

  Json parse_number() {
    Json value;
    value.kind = Json::Kind::kNumber;
    const std::size_t begin = at_;
    if (text_[at_] == '-') ++at_;
    bool integer = true;
    while (at_ < text_.size() && std::strchr("0123456789.eE+-", text_[at_]) && text_[at_]) {
      if (!std::isdigit(static_cast<unsigned char>(text_[at_]))) integer = false;
      ++at_;
    }
    const std::string digits(text_.substr(begin, at_ - begin));
    if (integer) {
      if (digits.size() > 18 || digits == "-") fail("a number out of range");
      value.integer = std::stoll(digits);
      value.is_integer = true;
    }
    return value;
  }

  std::string parse_string() {
    ++at_;  // the opening quote
    std::string out;
    while (true) {
      if (at_ >= text_.size()) fail("unterminated string");
      const char c = text_[at_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) fail("unterminated string");
      const char e = text_[at_++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (at_ + 4 > text_.size()) fail("a short \\u escape");
          unsigned code = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = text_[at_++];
            if (!std::isxdigit(static_cast<unsigned char>(h))) fail("a bad \\u escape");
            code = code * 16 + static_cast<unsigned>(std::isdigit(static_cast<unsigned char>(h))
                                                          ? h - '0'
                                                          : std::tolower(h) - 'a' + 10);
          }
          // UTF-8 of the code unit (names are ASCII in practice; surrogates pass as they are).
          if (code < 0x80) {
            out += static_cast<char>(code);
          } else if (code < 0x800) {
            out += static_cast<char>(0xC0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3F));
          } else {
            out += static_cast<char>(0xE0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
          }
          break;
        }
        default: fail("a bad escape");
      }
    }
  }

  std::string_view text_;
  const std::string& path_;
  std::size_t at_ = 0;
};

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

const Json* member(const Json& object, const char* key) {
  for (const auto& [name, value] : object.object) {
    if (name == key) return &value;
  }
  return nullptr;
}

}  // namespace

bool looks_like_safetensors(std::span<const std::uint8_t> bytes) {
  if (bytes.size() < 10) return false;
  const std::uint64_t n = read_u64_le(bytes.data());
  return n >= 2 && n <= bytes.size() - 8 && bytes[8] == '{';
}

std::string safetensors_bytes(const StateDict& weights) {
  std::string header = "{";
  std::vector<torch::Tensor> data;
  std::uint64_t offset = 0;
  for (const auto& [name, tensor] : weights) {
    const char* dtype = nullptr;
    for (const auto& [code, type] : kSafetensorsDtypes) {
      if (type == tensor.scalar_type()) dtype = code;
    }
    if (!dtype) {
      throw Error("safetensors: tensor '" + name + "' has dtype " +
                  std::string(c10::toString(tensor.scalar_type())) + ", which it cannot store");
    }
    torch::Tensor cpu = tensor.detach().to(torch::kCPU).contiguous();
    const std::uint64_t bytes = static_cast<std::uint64_t>(cpu.nbytes());
    // Appended piece by piece: GCC 12 warns falsely (-Wstringop-overflow) about a chain of `+`.
    if (header.size() > 1) header += ',';
    header += json_string(name);
    header += ":{\"dtype\":\"";
    header += dtype;
    header += "\",\"shape\":[";
    for (std::int64_t d = 0; d < cpu.dim(); ++d) {
      if (d) header += ',';
      header += std::to_string(cpu.size(d));
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," +
              std::to_string(offset + bytes) + "]}";
    offset += bytes;
    data.push_back(std::move(cpu));
  }
  header += "}";
  // Padded with spaces so the data starts 8-byte aligned, as the safetensors library pads.
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out += header;
  out.reserve(out.size() + offset);
  for (const torch::Tensor& t : data) {
    out.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  return out;
}

StateDict parse_safetensors(std::span<const std::uint8_t> bytes, const std::string& path) {
  if (bytes.size() < 8) throw Error(path + ": damaged safetensors file (shorter than its header)");
  const std::uint64_t header_size = read_u64_le(bytes.data());
  if (header_size > bytes.size() - 8 || header_size > kMaxHeaderBytes) {
    throw Error(path + ": damaged safetensors file (a header of " + std::to_string(header_size) +
                " bytes in a file of " + std::to_string(bytes.size()) + ")");
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8),
                              static_cast<std::size_t>(header_size));
  const Json header = JsonParser(text, path).parse();
  if (header.kind != Json::Kind::kObject) {
    throw Error(path + ": damaged safetensors file (the header is not a JSON object)");
  }
  const std::span<const std::uint8_t> data = bytes.subspan(8 + header_size);
  // Every tensor is checked before any is read: as the safetensors library reads a file, each
  // name once, and the tensors' bytes cover the data exactly, without overlaps or holes.
  struct Tensor {
    const std::string* name;
    torch::ScalarType type;
    std::vector<std::int64_t> sizes;
    std::uint64_t begin, end;
  };
  std::vector<Tensor> tensors;
  std::set<std::string_view> names;
  for (const auto& item : header.object) {
    const std::string& name = item.first;
    const Json& entry = item.second;
    if (name == "__metadata__") continue;
    const auto bad = [&](const std::string& why) {
      return Error(path + ": damaged safetensors file (tensor '" + name + "': " + why + ")");
    };
    const Json* dtype = member(entry, "dtype");
    const Json* shape = member(entry, "shape");
    const Json* offsets = member(entry, "data_offsets");
    if (entry.kind != Json::Kind::kObject || !dtype || dtype->kind != Json::Kind::kString ||
        !shape || shape->kind != Json::Kind::kArray || !offsets ||
        offsets->kind != Json::Kind::kArray || offsets->array.size() != 2) {
      throw bad("needs dtype, shape and data_offsets [begin, end]");
    }
    std::optional<torch::ScalarType> type;
    for (const auto& [code, t] : kSafetensorsDtypes) {
      if (dtype->string == code) type = t;
    }
    if (!type) throw bad("dtype " + dtype->string + ", which flowtrain does not read");
    std::vector<std::int64_t> sizes;
    std::int64_t numel = 1;
    for (const Json& d : shape->array) {
      if (d.kind != Json::Kind::kNumber || !d.is_integer || d.integer < 0) {
        throw bad("a shape entry that is not a whole number >= 0");
      }
      sizes.push_back(d.integer);
      if (__builtin_mul_overflow(numel, d.integer, &numel) ||
          numel > static_cast<std::int64_t>(bytes.size())) {
        throw bad("a shape larger than the file");
      }
    }
    for (const Json& o : offsets->array) {
      if (o.kind != Json::Kind::kNumber || !o.is_integer || o.integer < 0) {
        throw bad("data_offsets that are not whole numbers >= 0");
      }
    }
    const auto begin = static_cast<std::uint64_t>(offsets->array[0].integer);
    const auto end = static_cast<std::uint64_t>(offsets->array[1].integer);
    if (begin > end || end > data.size()) {
      throw bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                "] outside the " + std::to_string(data.size()) + " bytes of data");
    }
    const auto expected = static_cast<std::uint64_t>(numel) * c10::elementSize(*type);
    if (end - begin != expected) {
      throw bad(shape_text(sizes) + " " + dtype->string + " needs " + std::to_string(expected) +
                " bytes, data_offsets give " + std::to_string(end - begin));
    }
    if (!names.insert(name).second) throw bad("named twice in the header");
    tensors.push_back({&name, *type, std::move(sizes), begin, end});
  }
  std::vector<const Tensor*> by_offset;
  for (const Tensor& t : tensors) by_offset.push_back(&t);
  std::stable_sort(by_offset.begin(), by_offset.end(), [](const Tensor* a, const Tensor* b) {
    return std::pair(a->begin, a->end) < std::pair(b->begin, b->end);
  });
  std::uint64_t covered = 0;
  for (const Tensor* t : by_offset) {
    if (t->begin != covered) {
      throw Error(path + ": damaged safetensors file (tensor '" + *t->name + "': data_offsets [" +
                  std::to_string(t->begin) + ", " + std::to_string(t->end) + "] " +
                  (t->begin < covered ? "overlap another tensor's" : "leave a hole after byte ") +
                  (t->begin < covered ? "" : std::to_string(covered)) + ")");
    }
    covered = t->end;
  }
  if (covered != data.size()) {
    throw Error(path + ": damaged safetensors file (the tensors cover " + std::to_string(covered) +
                " of its " + std::to_string(data.size()) + " bytes of data)");
  }
  StateDict out;
  for (const Tensor& t : tensors) {
    out.emplace_back(*t.name, tensor_from_bytes(data.data() + t.begin,
                                                static_cast<std::size_t>(t.end - t.begin), t.type,
                                                t.sizes));
  }
  return out;
}

}  // namespace flowtrain::train
