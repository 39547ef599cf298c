#include "stages/train/weights.hpp"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "graph/atomic_file.hpp"
#include "graph/error.hpp"
#include "stages/data/image_decode.hpp"
#include "stages/train/checkpoint.hpp"
#include "stages/train/resnet.hpp"
#include "stages/train/torch_error.hpp"
#include "stages/train/vit.hpp"
#include "stages/train/zip_check.hpp"

namespace flowtrain::train {

// Both formats store tensors little-endian; we copy their bytes as they are.
static_assert(std::endian::native == std::endian::little, "weights files are little-endian");

namespace {

std::string shape_text(c10::IntArrayRef sizes) {
  std::string out = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}

// A tensor of `dtype` and `shape` holding `bytes` (which must be exactly its size), copied into
// memory of its own (the file's bytes need not be aligned for the dtype).
torch::Tensor tensor_from_bytes(const std::uint8_t* bytes,
                                std::size_t size,
                                torch::ScalarType dtype,
                                const std::vector<std::int64_t>& shape) {
  torch::Tensor tensor = torch::empty(shape, torch::TensorOptions().dtype(dtype));
  if (size > 0) std::memcpy(tensor.data_ptr(), bytes, size);
  return tensor;
}

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

std::uint64_t read_u64_le(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

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
    header += (header.size() > 1 ? "," : "") + json_string(name) + ":{\"dtype\":\"" + dtype +
              "\",\"shape\":[";
    for (std::int64_t d = 0; d < cpu.dim(); ++d) {
      header += (d ? "," : "") + std::to_string(cpu.size(d));
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

// ---------------------------------------------------------------------------------------------
// torch.save's zip: "<archive>/data.pkl", a pickle (protocol 2) of the dict whose tensors are
// persistent ids ('storage', torch.FloatStorage, key, location, numel) of raw storages
// "<archive>/data/<key>", each rebuilt by torch._utils._rebuild_tensor_v2(storage, offset,
// size, stride, ...). LibTorch 1.13's unpickler reads an OrderedDict (what state_dict() returns)
// as None, so torch::pickle_load cannot read these files: this reads the few opcodes such a
// pickle uses, each bounds-checked.

struct PyValue;
using PyRef = std::shared_ptr<PyValue>;
struct PyValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kTuple, kList, kDict, kGlobal, kTensor };
  Kind kind = Kind::kNone;
  std::int64_t integer = 0;
  double real = 0;
  std::string string;  // kString; kGlobal: "module.name"
  std::vector<PyRef> items;
  std::vector<std::pair<PyRef, PyRef>> dict;
  torch::Tensor tensor;
};

PyRef make(PyValue::Kind kind) {
  auto v = std::make_shared<PyValue>();
  v->kind = kind;
  return v;
}

// LibTorch reads the archive from the bytes already read and checked, not the file again.
class BytesAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesAdapter(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}
  std::size_t size() const override { return bytes_.size(); }
  std::size_t read(std::uint64_t pos, void* buf, std::size_t n, const char*) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<std::size_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  std::span<const std::uint8_t> bytes_;
};

torch::ScalarType storage_dtype(const std::string& global, const std::string& path) {
  static const std::map<std::string, torch::ScalarType> kStorages = {
      {"torch.FloatStorage", torch::kFloat},   {"torch.DoubleStorage", torch::kDouble},
      {"torch.HalfStorage", torch::kHalf},     {"torch.BFloat16Storage", torch::kBFloat16},
      {"torch.LongStorage", torch::kLong},     {"torch.IntStorage", torch::kInt},
      {"torch.ShortStorage", torch::kShort},   {"torch.CharStorage", torch::kChar},
      {"torch.ByteStorage", torch::kByte},     {"torch.BoolStorage", torch::kBool},
  };
  const auto found = kStorages.find(global);
  if (found == kStorages.end()) {
    throw Error(path + ": a tensor of storage type " + global + ", which flowtrain does not read");
  }
  return found->second;
}

class StateDictUnpickler {
 public:
  StateDictUnpickler(std::span<const std::uint8_t> pickle,
                     caffe2::serialize::PyTorchStreamReader& reader,
                     const std::string& path)
      : p_(pickle), reader_(reader), path_(path) {}

  PyRef run() {
    while (true) {
      const std::uint8_t op = byte();
      switch (op) {
        case 0x80: byte(); break;         // PROTO
        case 0x95: bytes(8); break;       // FRAME (protocol 4)
        case '}': push(make(PyValue::Kind::kDict)); break;
        case ']': push(make(PyValue::Kind::kList)); break;
        case ')': push(make(PyValue::Kind::kTuple)); break;
        case '(': marks_.push_back(stack_.size()); break;
        case 't': push(tuple(pop_mark())); break;
        case 0x85: push(tuple(pop_n(1))); break;  // TUPLE1
        case 0x86: push(tuple(pop_n(2))); break;  // TUPLE2
        case 0x87: push(tuple(pop_n(3))); break;  // TUPLE3
        case 'c': {                               // GLOBAL module\nname\n
          std::string module = line();
          push(global(module + "." + line()));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          const PyRef name = pop(), module = pop();
          if (name->kind != PyValue::Kind::kString || module->kind != PyValue::Kind::kString) {
            fail("a global named by non-strings");
          }
          push(global(module->string + "." + name->string));
          break;
        }
        case 'q': memo(byte()); break;                // BINPUT
        case 'r': memo(u32()); break;                 // LONG_BINPUT
        case 0x94: memo(static_cast<std::uint32_t>(memo_.size())); break;  // MEMOIZE
        case 'h': push(recall(byte())); break;        // BINGET
        case 'j': push(recall(u32())); break;         // LONG_BINGET
        case 'X': push(string(u32())); break;         // BINUNICODE
        case 0x8c: push(string(byte())); break;       // SHORT_BINUNICODE
        case 0x8d: push(string(u64())); break;        // BINUNICODE8
        case 'J': push(integer(static_cast<std::int32_t>(u32()))); break;  // BININT
        case 'K': push(integer(byte())); break;                            // BININT1
        case 'M': push(integer(u16())); break;                             // BININT2
        case 0x8a: push(long1()); break;                                   // LONG1
        case 'N': push(make(PyValue::Kind::kNone)); break;
        case 0x88: push(boolean(true)); break;
        case 0x89: push(boolean(false)); break;
        case 'G': push(binfloat()); break;
        case 'Q': push(persistent(pop())); break;  // BINPERSID
        case 'R': {                                // REDUCE
          const PyRef args = pop(), callable = pop();
          push(reduce(*callable, *args));
          break;
        }
        case 'b': {  // BUILD: an OrderedDict's _metadata, a tensor's state: not needed
          pop();
          top();
          break;
        }
        case 's': {  // SETITEM
          const PyRef value = pop(), key = pop();
          dict_of(top()).dict.emplace_back(key, value);
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<PyRef> items = pop_mark();
          if (items.size() % 2) fail("SETITEMS with an odd count");
          PyValue& dict = dict_of(top());
          for (std::size_t i = 0; i < items.size(); i += 2) dict.dict.emplace_back(items[i], items[i + 1]);
          break;
        }
        case 'a': {  // APPEND
          const PyRef value = pop();
          list_of(top()).items.push_back(value);
          break;
        }
        case 'e': {  // APPENDS
          std::vector<PyRef> items = pop_mark();
          PyValue& list = list_of(top());
          list.items.insert(list.items.end(), items.begin(), items.end());
          break;
        }
        case '.':  // STOP
          if (stack_.size() != 1) fail("STOP with " + std::to_string(stack_.size()) + " values");
          return stack_.back();
        default: {
          char buf[8];
          std::snprintf(buf, sizeof buf, "0x%02x", op);
          fail(std::string("pickle opcode ") + buf + ", which a state_dict does not use");
        }
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(path_ + ": not a state_dict flowtrain can read (" + what + " at pickle byte " +
                std::to_string(at_) + ")");
  }
  const std::uint8_t* bytes(std::size_t n) {
    if (n > p_.size() - at_) fail("the pickle ends early");
    const std::uint8_t* out = p_.data() + at_;
    at_ += n;
    return out;
  }
  std::uint8_t byte() { return *bytes(1); }
  std::uint32_t u16() {
    const std::uint8_t* b = bytes(2);
    return static_cast<std::uint32_t>(b[0] | b[1] << 8);
  }
  std::uint32_t u32() {
    const std::uint8_t* b = bytes(4);
    return static_cast<std::uint32_t>(b[0]) | static_cast<std::uint32_t>(b[1]) << 8 |
           static_cast<std::uint32_t>(b[2]) << 16 | static_cast<std::uint32_t>(b[3]) << 24;
  }
  std::uint64_t u64() { return read_u64_le(bytes(8)); }
  std::string line() {
    const auto* begin = p_.data() + at_;
    const auto* end = std::find(begin, p_.data() + p_.size(), '\n');
    if (end == p_.data() + p_.size()) fail("an unterminated global name");
    at_ += static_cast<std::size_t>(end - begin) + 1;
    return std::string(begin, end);
  }

  void push(PyRef v) {
    if (stack_.size() > 1'000'000) fail("a stack too deep");
    stack_.push_back(std::move(v));
  }
  PyRef pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      fail("a pop from an empty stack");
    }
    PyRef v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  PyRef& top() {
    if (stack_.empty()) fail("an empty stack");
    return stack_.back();
  }
  std::vector<PyRef> pop_n(std::size_t n) {
    std::vector<PyRef> out(n);
    for (std::size_t i = n; i-- > 0;) out[i] = pop();
    return out;
  }
  std::vector<PyRef> pop_mark() {
    if (marks_.empty() || marks_.back() > stack_.size()) fail("no MARK");
    const std::size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<PyRef> out(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return out;
  }
  void memo(std::uint32_t key) { memo_[key] = top(); }
  PyRef recall(std::uint32_t key) {
    const auto found = memo_.find(key);
    if (found == memo_.end()) fail("a memo key never stored");
    return found->second;
  }
  PyValue& dict_of(PyRef& v) {
    if (v->kind != PyValue::Kind::kDict) fail("SETITEM on a non-dict");
    return *v;
  }
  PyValue& list_of(PyRef& v) {
    if (v->kind != PyValue::Kind::kList) fail("APPEND on a non-list");
    return *v;
  }

  static PyRef tuple(std::vector<PyRef> items) {
    PyRef v = make(PyValue::Kind::kTuple);
    v->items = std::move(items);
    return v;
  }
  static PyRef global(std::string name) {
    PyRef v = make(PyValue::Kind::kGlobal);
    v->string = std::move(name);
    return v;
  }
  static PyRef integer(std::int64_t i) {
    PyRef v = make(PyValue::Kind::kInt);
    v->integer = i;
    return v;
  }
  static PyRef boolean(bool b) {
    PyRef v = make(PyValue::Kind::kBool);
    v->integer = b;
    return v;
  }
  PyRef string(std::uint64_t n) {
    if (n > p_.size()) fail("a string longer than the pickle");
    const std::uint8_t* b = bytes(static_cast<std::size_t>(n));
    PyRef v = make(PyValue::Kind::kString);
    v->string.assign(reinterpret_cast<const char*>(b), static_cast<std::size_t>(n));
    return v;
  }
  PyRef long1() {
    const std::uint8_t n = byte();
    if (n > 8) fail("an integer wider than 64 bits");
    const std::uint8_t* b = bytes(n);
    std::uint64_t value = 0;
    for (int i = n - 1; i >= 0; --i) value = (value << 8) | b[i];
    if (n > 0 && n < 8 && (b[n - 1] & 0x80)) value |= ~std::uint64_t{0} << (8 * n);  // sign
    return integer(static_cast<std::int64_t>(value));
  }
  PyRef binfloat() {
    const std::uint8_t* b = bytes(8);
    std::uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = (bits << 8) | b[i];  // big-endian
    PyRef v = make(PyValue::Kind::kFloat);
    v->real = std::bit_cast<double>(bits);
    return v;
  }

  std::int64_t int_of(const PyRef& v, const char* what) const {
    if (v->kind != PyValue::Kind::kInt) fail(std::string("a non-integer ") + what);
    return v->integer;
  }
  std::vector<std::int64_t> ints_of(const PyRef& v, const char* what) const {
    if (v->kind != PyValue::Kind::kTuple) fail(std::string("a non-tuple ") + what);
    std::vector<std::int64_t> out;
    for (const PyRef& item : v->items) out.push_back(int_of(item, what));
    return out;
  }

  // ('storage', torch.FloatStorage, key, location, numel): the storage, a 1-D tensor.
  PyRef persistent(const PyRef& id) {
    if (id->kind != PyValue::Kind::kTuple || id->items.size() != 5 ||
        id->items[0]->kind != PyValue::Kind::kString || id->items[0]->string != "storage" ||
        id->items[1]->kind != PyValue::Kind::kGlobal ||
        id->items[2]->kind != PyValue::Kind::kString) {
      fail("a persistent id that is not a storage");
    }
    const std::string& key = id->items[2]->string;
    PyRef& storage = storages_[key];
    if (storage) return storage;
    const torch::ScalarType dtype = storage_dtype(id->items[1]->string, path_);
    const std::int64_t numel = int_of(id->items[4], "storage size");
    const std::string record = "data/" + key;
    if (!reader_.hasRecord(record)) fail("no storage entry '" + record + "'");
    auto [data, size] = reader_.getRecord(record);
    const auto item = static_cast<std::int64_t>(c10::elementSize(dtype));
    if (numel < 0 || static_cast<std::uint64_t>(numel) > size / static_cast<std::uint64_t>(item)) {
      fail("storage '" + key + "' of " + std::to_string(numel) + " elements in " +
           std::to_string(size) + " bytes");
    }
    storage = make(PyValue::Kind::kTensor);
    storage->tensor = tensor_from_bytes(static_cast<const std::uint8_t*>(data.get()),
                                        static_cast<std::size_t>(numel * item), dtype, {numel});
    return storage;
  }

  PyRef reduce(const PyValue& callable, const PyValue& args) {
    if (callable.kind != PyValue::Kind::kGlobal || args.kind != PyValue::Kind::kTuple) {
      fail("a call of a non-global");
    }
    const std::string& name = callable.string;
    if (name == "collections.OrderedDict" || name == "builtins.dict") {
      if (!args.items.empty()) fail(name + " with arguments");
      return make(PyValue::Kind::kDict);
    }
    // LibTorch's pickle_save (our own state_dict files) tags a dict with its type.
    if (name == "torch.jit._pickle.restore_type_tag" && args.items.size() == 2) {
      return args.items[0];
    }
    if (name == "torch._utils._rebuild_parameter" && !args.items.empty() &&
        args.items[0]->kind == PyValue::Kind::kTensor) {
      return args.items[0];
    }
    if (name == "torch._utils._rebuild_tensor_v2" && args.items.size() >= 4) {
      const PyRef& storage = args.items[0];
      if (storage->kind != PyValue::Kind::kTensor) fail("a tensor without a storage");
      const std::int64_t offset = int_of(args.items[1], "storage offset");
      const std::vector<std::int64_t> size = ints_of(args.items[2], "tensor size");
      const std::vector<std::int64_t> stride = ints_of(args.items[3], "tensor stride");
      if (size.size() != stride.size()) fail("a tensor whose size and stride differ in length");
      // The last element the view reaches must lie in the storage.
      const std::int64_t numel = storage->tensor.numel();
      bool empty = false;
      bool overflow = offset < 0;
      std::int64_t last = offset;
      for (std::size_t d = 0; d < size.size(); ++d) {
        if (size[d] < 0 || stride[d] < 0) fail("a negative tensor size or stride");
        if (size[d] == 0) empty = true;
        std::int64_t reach = 0;
        overflow = overflow || __builtin_mul_overflow(size[d] - 1, stride[d], &reach) ||
                   __builtin_add_overflow(last, reach, &last);
      }
      if (overflow || (!empty && last >= numel)) {
        fail("a tensor " + shape_text(size) + " reaching past its storage of " +
             std::to_string(numel) + " elements");
      }
      PyRef v = make(PyValue::Kind::kTensor);
      v->tensor = empty ? torch::empty(size, storage->tensor.options())
                        : storage->tensor.as_strided(size, stride, offset).clone();
      return v;
    }
    fail("an object " + name + ", which is not a tensor or a dict");
  }

  std::span<const std::uint8_t> p_;
  caffe2::serialize::PyTorchStreamReader& reader_;
  const std::string& path_;
  std::size_t at_ = 0;
  std::vector<PyRef> stack_;
  std::vector<std::size_t> marks_;
  std::map<std::uint32_t, PyRef> memo_;
  std::map<std::string, PyRef> storages_;
};

// The root of a torch.save file as a StateDict: a dict of tensors, or a dict holding one under
// "state_dict" or "model" (as training scripts save them).
StateDict state_dict_of(const PyValue& root, const std::string& path) {
  if (root.kind != PyValue::Kind::kDict) {
    throw Error(path + ": holds a pickled object, not a dict of tensors (save model.state_dict())");
  }
  StateDict out;
  for (const auto& [key, value] : root.dict) {
    if (key->kind != PyValue::Kind::kString) {
      throw Error(path + ": a state_dict key that is not a string");
    }
    if (value->kind == PyValue::Kind::kDict &&
        (key->string == "state_dict" || key->string == "model")) {
      return state_dict_of(*value, path);
    }
    if (value->kind != PyValue::Kind::kTensor) {
      throw Error(path + ": '" + key->string + "' is not a tensor (save model.state_dict())");
    }
    out.emplace_back(key->string, value->tensor);
  }
  return out;
}

StateDict read_torch_save(std::span<const std::uint8_t> bytes, const std::string& path) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(
        std::make_shared<BytesAdapter>(bytes));
  } catch (const std::exception& e) {
    throw Error(path + ": not a weights file (" + short_reason(e) + ")");
  }
  if (!reader->hasRecord("data.pkl")) {
    throw Error(path + ": a zip archive without data.pkl, not a torch.save file");
  }
  auto [data, size] = reader->getRecord("data.pkl");
  StateDictUnpickler unpickler({static_cast<const std::uint8_t*>(data.get()), size}, *reader, path);
  return state_dict_of(*unpickler.run(), path);
}

// ---------------------------------------------------------------------------------------------
// torchvision's VisionTransformer names <-> ours (timm's). Prefixes end in '.'; the others are
// whole names.

constexpr std::pair<const char*, const char*> kVitTopNames[] = {
    {"patch_embed.proj.", "conv_proj."}, {"cls_token", "class_token"},
    {"pos_embed", "encoder.pos_embedding"}, {"norm.", "encoder.ln."},
    {"head.", "heads.head."},
};
constexpr std::pair<const char*, const char*> kVitBlockNames[] = {
    {"norm1.", "ln_1."},
    {"attn.qkv.weight", "self_attention.in_proj_weight"},
    {"attn.qkv.bias", "self_attention.in_proj_bias"},
    {"attn.proj.", "self_attention.out_proj."},
    {"norm2.", "ln_2."},
    {"mlp.fc1.", "mlp.0."},
    {"mlp.fc2.", "mlp.3."},
};
// torchvision before 0.13 named the MLP's layers so (0.14 still loads them).
constexpr std::pair<const char*, const char*> kVitOldBlockNames[] = {
    {"mlp.fc1.", "mlp.linear_1."},
    {"mlp.fc2.", "mlp.linear_2."},
};
constexpr const char* kOurBlock = "blocks.";
constexpr const char* kTorchvisionBlock = "encoder.layers.encoder_layer_";

bool starts_with(const std::string& s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// `name` renamed by the first pair whose `from` side matches it (a prefix ending in '.', or the
// whole name), or nullopt.
template <std::size_t N>
std::optional<std::string> rename(const std::string& name,
                                  const std::pair<const char*, const char*> (&pairs)[N],
                                  bool forward) {
  for (const auto& pair : pairs) {
    const std::string from = forward ? pair.first : pair.second;
    const std::string to = forward ? pair.second : pair.first;
    if (from.back() == '.' ? starts_with(name, from) : name == from) {
      return to + name.substr(from.size());
    }
  }
  return std::nullopt;
}

// A block's name "<block prefix><i>.<rest>" as (i, rest).
std::optional<std::pair<std::string, std::string>> block_part(const std::string& name,
                                                              const char* prefix) {
  if (!starts_with(name, prefix)) return std::nullopt;
  const std::size_t begin = std::strlen(prefix);
  const std::size_t dot = name.find('.', begin);
  if (dot == std::string::npos || dot == begin) return std::nullopt;
  const std::string index = name.substr(begin, dot - begin);
  if (!std::all_of(index.begin(), index.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::make_pair(index, name.substr(dot + 1));
}

std::optional<std::string> vit_to_torchvision(const std::string& ours) {
  if (const auto block = block_part(ours, kOurBlock)) {
    const auto rest = rename(block->second, kVitBlockNames, true);
    if (!rest) return std::nullopt;
    return kTorchvisionBlock + block->first + "." + *rest;
  }
  return rename(ours, kVitTopNames, true);
}

std::optional<std::string> vit_from_torchvision(const std::string& theirs) {
  if (const auto block = block_part(theirs, kTorchvisionBlock)) {
    auto rest = rename(block->second, kVitBlockNames, false);
    if (!rest) rest = rename(block->second, kVitOldBlockNames, false);
    if (!rest) return std::nullopt;
    return kOurBlock + block->first + "." + *rest;
  }
  return rename(theirs, kVitTopNames, false);
}

bool is_torchvision_vit(const StateDict& weights) {
  return std::any_of(weights.begin(), weights.end(), [](const auto& item) {
    return item.first == "class_token" || starts_with(item.first, "conv_proj.") ||
           starts_with(item.first, kTorchvisionBlock);
  });
}

// Whether `name` is `prefix` or lies under it ("head" covers "head.weight", not "head_dist.w").
bool under(const std::string& name, const std::string& prefix) {
  return name == prefix || (starts_with(name, prefix) && name[prefix.size()] == '.') ||
         (!prefix.empty() && prefix.back() == '.' && starts_with(name, prefix));
}

bool skipped(const std::vector<std::string>& skip, const std::string& name) {
  return std::any_of(skip.begin(), skip.end(),
                     [&](const std::string& prefix) { return under(name, prefix); });
}

// The model's parameters and buffers in the order PyTorch's state_dict() lists them: module by
// module, depth first, each module's own parameters then its buffers.
StateDict named_tensors(const torch::nn::Module& model) {
  StateDict out;
  for (const auto& module : model.named_modules("", /*include_self=*/true)) {
    const std::string prefix = module.key().empty() ? "" : module.key() + ".";
    for (const auto& item : module.value()->named_parameters(/*recurse=*/false)) {
      out.emplace_back(prefix + item.key(), item.value());
    }
    for (const auto& item : module.value()->named_buffers(/*recurse=*/false)) {
      out.emplace_back(prefix + item.key(), item.value());
    }
  }
  return out;
}

}  // namespace

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
  StateDict out;
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
    out.emplace_back(name, tensor_from_bytes(data.data() + begin, static_cast<std::size_t>(expected),
                                             *type, sizes));
  }
  return out;
}

StateDict read_weights(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw Error(path + ": no such weights file");
  std::vector<std::uint8_t> buffer;
  std::span<const std::uint8_t> bytes;
  if (const std::string problem =
          data::read_file(path, buffer, bytes, std::numeric_limits<std::int64_t>::max());
      !problem.empty()) {
    throw Error(path + ": cannot read (" + problem + ")");
  }
  // By its name, a damaged safetensors file still gets the reason it is damaged. (Before the
  // zip check: raw tensor data may hold a zip directory's signature by chance.)
  const bool named_safetensors =
      path.size() >= 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0;
  if (named_safetensors || looks_like_safetensors(bytes)) return parse_safetensors(bytes, path);
  const bool zip = bytes.size() >= 4 && std::memcmp(bytes.data(), "PK\x03\x04", 4) == 0;
  if (zip) {
    if (const std::string problem = zip_problem(bytes); !problem.empty()) {
      throw Error(path + ": damaged weights file (" + problem + ")");
    }
  }
  if (!zip) {
    if (bytes.size() >= 2 && bytes[0] == 0x80 && bytes[1] <= 5) {
      throw Error(path + ": torch.save's legacy format (_use_new_zipfile_serialization=False): "
                         "load it and save it again with torch.save's default");
    }
    throw Error(path + ": not a weights file (neither safetensors nor a torch.save zip)");
  }
  bool scripted = false;  // a TorchScript archive: a flowtrain checkpoint, or a module
  try {
    caffe2::serialize::PyTorchStreamReader reader(std::make_shared<BytesAdapter>(bytes));
    scripted = reader.hasRecord("constants.pkl");
  } catch (const std::exception& e) {
    throw Error(path + ": not a weights file (" + short_reason(e) + ")");
  }
  if (scripted) {
    if (std::optional<Checkpoint> checkpoint = try_read_checkpoint(path)) {
      return model_weights(*load_model(*checkpoint));
    }
    throw Error(path + ": a TorchScript module, not a state_dict (save model.state_dict() with "
                       "torch.save)");
  }
  return read_torch_save(bytes, path);
}

std::string weights_bytes(const StateDict& weights, WeightsFormat format) {
  if (format == WeightsFormat::kSafetensors) return safetensors_bytes(weights);
  c10::Dict<std::string, torch::Tensor> dict;
  for (const auto& [name, tensor] : weights) {
    dict.insert(name, tensor.detach().to(torch::kCPU).contiguous());
  }
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  return std::string(bytes.begin(), bytes.end());
}

void write_weights(const std::string& path, const StateDict& weights, WeightsFormat format) {
  write_file_atomically(path, weights_bytes(weights, format));
}

StateDict model_weights(const torch::nn::Module& model, WeightsLayout layout) {
  StateDict out;
  torch::NoGradGuard no_grad;
  const bool vit = dynamic_cast<const ViTImpl*>(&model) != nullptr;
  const bool resnet = dynamic_cast<const ResNetImpl*>(&model) != nullptr;
  if (layout == WeightsLayout::kTorchvision && !vit && !resnet) {
    throw Error("layout torchvision: the model is neither our ViT nor our ResNet (use the "
                "default layout)");
  }
  for (const auto& [name, tensor] : named_tensors(model)) {
    std::string out_name = name;
    if (layout == WeightsLayout::kTorchvision) {
      std::optional<std::string> mapped = vit ? vit_to_torchvision(name) : std::optional(name);
      if (starts_with(name, "regression_head.")) mapped.reset();
      if (!mapped) {
        throw Error("layout torchvision: torchvision's " +
                    std::string(vit ? "VisionTransformer" : "ResNet") + " has no place for '" +
                    name + "' (" +
                    (starts_with(name, "regression_head.") ? "a regression head"
                     : name == "dist_token" || starts_with(name, "head_dist.")
                         ? "DeiT's distillation token"
                         : "a tensor of ours") +
                    "): export it with the default layout");
      }
      out_name = *mapped;
    }
    out.emplace_back(out_name, tensor.detach().to(torch::kCPU).contiguous().clone());
  }
  return out;
}

std::vector<std::string> skip_prefixes(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    const std::size_t begin = item.find_first_not_of(" \t");
    if (begin == std::string::npos) continue;
    out.push_back(item.substr(begin, item.find_last_not_of(" \t") - begin + 1));
  }
  return out;
}

InitCounts init_weights(torch::nn::Module& model, const WeightsInit& init) {
  const std::string& path = init.path;
  StateDict file = read_weights(path);
  // DistributedDataParallel's wrapper prefixes every name with "module.".
  if (!file.empty() && std::all_of(file.begin(), file.end(), [](const auto& item) {
        return starts_with(item.first, "module.");
      })) {
    for (auto& item : file) item.first.erase(0, 7);
  }
  InitCounts counts;
  counts.layout = "flowtrain";
  const StateDict ours = named_tensors(model);
  const bool model_is_vit = dynamic_cast<const ViTImpl*>(&model) != nullptr;
  // The file's tensors by the model's names, each with its name in the file (for errors).
  std::map<std::string, std::pair<std::string, torch::Tensor>> by_our_name;
  const bool torchvision = model_is_vit && is_torchvision_vit(file);
  if (torchvision) counts.layout = "torchvision";
  for (auto& [name, tensor] : file) {
    std::optional<std::string> our_name = torchvision ? vit_from_torchvision(name) : name;
    if (!our_name) continue;  // unexpected, said below
    by_our_name.emplace(*our_name, std::make_pair(name, tensor));
  }
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (model's, file's)
  std::set<std::string> used;
  for (const auto& [name, target] : ours) {
    const auto found = by_our_name.find(name);
    const std::string file_name =
        found != by_our_name.end()
            ? found->second.first
            : (torchvision ? vit_to_torchvision(name).value_or(name) : name);
    if (skipped(init.skip, name) || skipped(init.skip, file_name)) {
      ++counts.skipped;
      if (found != by_our_name.end()) used.insert(name);
      continue;
    }
    if (found == by_our_name.end()) {
      throw Error(path + ": missing key '" + file_name + "' " + shape_text(target.sizes()) +
                  " (the model has it, the file does not; init_skip leaves it as initialised)");
    }
    const torch::Tensor& value = found->second.second;
    if (value.sizes() != target.sizes()) {
      throw Error(path + ": key '" + file_name + "' is " + shape_text(value.sizes()) +
                  " in the file but " + shape_text(target.sizes()) +
                  " in the model (init_skip leaves it as initialised)");
    }
    if (value.is_floating_point() != target.is_floating_point()) {
      throw Error(path + ": key '" + file_name + "' is " +
                  std::string(c10::toString(value.scalar_type())) + " in the file but " +
                  std::string(c10::toString(target.scalar_type())) + " in the model");
    }
    copies.emplace_back(target, value);
    used.insert(name);
  }
  for (const auto& [name, tensor] : file) {
    const std::optional<std::string> our_name = torchvision ? vit_from_torchvision(name) : name;
    const bool is_used = our_name && used.count(*our_name);
    if (is_used || skipped(init.skip, name) || (our_name && skipped(init.skip, *our_name))) {
      continue;
    }
    throw Error(path + ": unexpected key '" + name + "' " + shape_text(tensor.sizes()) +
                " (the model has no such tensor; init_skip ignores it)");
  }
  torch::NoGradGuard no_grad;
  for (auto& [target, value] : copies) target.copy_(value);
  counts.loaded = copies.size();
  return counts;
}

}  // namespace flowtrain::train
