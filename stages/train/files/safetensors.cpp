// safetensors files read and written (weight_files.hpp). The header is read with nlohmann-json;
// every size and offset in it is checked before it is used.
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
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

using Json = nlohmann::json;

// A parsed header and its tensors' names in the order the file lists them.
struct Header {
  Json json;
  std::vector<std::string> names;  // the top-level keys, "__metadata__" included
};

// Parses a safetensors header: JSON (nlohmann), its top-level names each once (as the
// safetensors library reads them) and nested no deeper than a header is. Errors name the file
// and what is wrong, on one line.
Header parse_header(std::string_view text, const std::string& path) {
  Header header;
  std::set<std::string> seen;
  const auto check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth > 8) throw Error(path + ": damaged safetensors header (nesting too deep)");
    if (event == Json::parse_event_t::key && depth == 1) {
      const std::string& name = parsed.get_ref<const std::string&>();
      if (!seen.insert(name).second) {
        throw Error(path + ": damaged safetensors file (tensor '" + name +
                    "': named twice in the header)");
      }
      header.names.push_back(name);
    }
    return true;
  };
  try {
    header.json = Json::parse(text.begin(), text.end(), check);
  } catch (const Json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 9: syntax error ...":
    // the reason, and the byte of the file it stopped at.
    std::string why = e.what();
    if (const std::size_t column = why.find("column "); column != std::string::npos) {
      if (const std::size_t colon = why.find(": ", column); colon != std::string::npos) {
        why = why.substr(colon + 2);
      }
    }
    throw Error(path + ": damaged safetensors header (" + why + ", at byte " +
                std::to_string(7 + e.byte) + ")");
  }
  return header;
}

// A whole number >= 0 of a header, or std::nullopt.
std::optional<std::uint64_t> whole(const Json& value) {
  if (!value.is_number_unsigned()) return std::nullopt;
  return value.get<std::uint64_t>();
}

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
  const Header header = parse_header(text, path);
  if (!header.json.is_object()) {
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
  for (const std::string& name : header.names) {
    if (name == "__metadata__") continue;
    const Json& entry = header.json.at(name);
    const auto bad = [&](const std::string& why) {
      return Error(path + ": damaged safetensors file (tensor '" + name + "': " + why + ")");
    };
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() ||
        !entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2) {
      throw bad("needs dtype, shape and data_offsets [begin, end]");
    }
    const std::string& dtype = entry["dtype"].get_ref<const std::string&>();
    std::optional<torch::ScalarType> type;
    for (const auto& [code, t] : kSafetensorsDtypes) {
      if (dtype == code) type = t;
    }
    if (!type) throw bad("dtype " + dtype + ", which flowtrain does not read");
    std::vector<std::int64_t> sizes;
    std::int64_t numel = 1;
    for (const Json& d : entry["shape"]) {
      const std::optional<std::uint64_t> size = whole(d);
      if (!size) throw bad("a shape entry that is not a whole number >= 0");
      if (*size > bytes.size() ||
          __builtin_mul_overflow(numel, static_cast<std::int64_t>(*size), &numel) ||
          numel > static_cast<std::int64_t>(bytes.size())) {
        throw bad("a shape larger than the file");
      }
      sizes.push_back(static_cast<std::int64_t>(*size));
    }
    const std::optional<std::uint64_t> begin = whole(entry["data_offsets"][0]);
    const std::optional<std::uint64_t> end = whole(entry["data_offsets"][1]);
    if (!begin || !end) throw bad("data_offsets that are not whole numbers >= 0");
    if (*begin > *end || *end > data.size()) {
      throw bad("data_offsets [" + std::to_string(*begin) + ", " + std::to_string(*end) +
                "] outside the " + std::to_string(data.size()) + " bytes of data");
    }
    const auto expected = static_cast<std::uint64_t>(numel) * c10::elementSize(*type);
    if (*end - *begin != expected) {
      throw bad(shape_text(sizes) + " " + dtype + " needs " + std::to_string(expected) +
                " bytes, data_offsets give " + std::to_string(*end - *begin));
    }
    tensors.push_back({&name, *type, std::move(sizes), *begin, *end});
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
