// torch.save's zip read (weight_files.hpp): its pickle, by a reader of the few opcodes a
// state_dict's uses, each bounds-checked, and its storages, each checked against the size the
// pickle gives it before it is read.
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "graph/error.hpp"
#include "stages/train/files/weight_files.hpp"
#include "stages/train/files/zip_check.hpp"

namespace flowtrain::train {

namespace {

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
  int depth = 0;        // containers inside containers below this one (0: holds none)
  bool placed = false;  // it is inside another container: it no longer changes (no cycles)
};

// The deepest a state_dict's pickle nests containers: a checkpoint of dicts of a model's and an
// optimizer's state nests a few; a pickle nesting 100,000 lists would crash a reader (or the
// freeing of what it read) that recursed on it.
constexpr int kMaxNesting = 100;

// The largest state_dict pickle read: its keys and shapes (the tensors are entries of their own),
// some hundred bytes a tensor.
constexpr std::uint64_t kMaxPickleBytes = std::uint64_t{256} << 20;

PyRef make(PyValue::Kind kind) {
  auto v = std::make_shared<PyValue>();
  v->kind = kind;
  return v;
}

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
                     const std::vector<ZipEntry>& entries,
                     const ReleasePages& release,
                     const std::string& path)
      : p_(pickle), entries_(entries), release_(release), path_(path) {}

  /// The entries the storages read (each checked against its CRC as it was).
  const std::set<const ZipEntry*>& read_entries() const { return read_; }

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
          PyValue& dict = dict_of(top());
          place(dict, key);
          place(dict, value);
          dict.dict.emplace_back(key, value);
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<PyRef> items = pop_mark();
          if (items.size() % 2) fail("SETITEMS with an odd count");
          PyValue& dict = dict_of(top());
          for (std::size_t i = 0; i < items.size(); i += 2) {
            place(dict, items[i]);
            place(dict, items[i + 1]);
            dict.dict.emplace_back(items[i], items[i + 1]);
          }
          break;
        }
        case 'a': {  // APPEND
          const PyRef value = pop();
          PyValue& list = list_of(top());
          place(list, value);
          list.items.push_back(value);
          break;
        }
        case 'e': {  // APPENDS
          std::vector<PyRef> items = pop_mark();
          PyValue& list = list_of(top());
          for (const PyRef& item : items) place(list, item);
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

  // `item` goes inside `container`: never into itself nor into a container placed in another
  // already (so the values form no cycle), and never deeper than kMaxNesting.
  void place(PyValue& container, const PyRef& item) {
    if (item.get() == &container) fail("a container inside itself");
    if (container.placed) fail("a container changed after it was placed in another");
    item->placed = true;
    container.depth = std::max(container.depth, item->depth + 1);
    if (container.depth > kMaxNesting) {
      fail("containers nested deeper than " + std::to_string(kMaxNesting));
    }
  }
  PyRef tuple(std::vector<PyRef> items) {
    PyRef v = make(PyValue::Kind::kTuple);
    for (const PyRef& item : items) place(*v, item);
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
    const ZipEntry* entry = find_entry(entries_, record);
    if (!entry) fail("no storage entry '" + record + "'");
    // The entry must hold exactly the storage, checked before it is read: an entry claiming
    // gigabytes behind a storage of 4 elements is refused, not read.
    const auto item = static_cast<std::uint64_t>(c10::elementSize(dtype));
    if (numel < 0 || static_cast<std::uint64_t>(numel) > entry->size / item ||
        static_cast<std::uint64_t>(numel) * item != entry->size) {
      fail("storage '" + key + "' of " + std::to_string(numel) + " elements in " +
           std::to_string(entry->size) + " bytes");
    }
    storage = make(PyValue::Kind::kTensor);
    storage->tensor = torch::empty({numel}, torch::TensorOptions().dtype(dtype));
    if (const std::string problem =
            read_entry(*entry,
                       {static_cast<std::uint8_t*>(storage->tensor.data_ptr()),
                        static_cast<std::size_t>(entry->size)},
                       release_);
        !problem.empty()) {
      throw Error(path_ + ": damaged weights file (" + problem + ")");
    }
    read_.insert(entry);
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
  const std::vector<ZipEntry>& entries_;
  const ReleasePages& release_;
  std::set<const ZipEntry*> read_;
  const std::string& path_;
  std::size_t at_ = 0;
  std::vector<PyRef> stack_;
  std::vector<std::size_t> marks_;
  std::map<std::uint32_t, PyRef> memo_;
  std::map<std::string, PyRef> storages_;
};

// The root of a torch.save file as a StateDict: a dict of tensors, or a dict holding one under
// "state_dict" or "model" (as training scripts save them).
// A key given twice holds its last value in its first place, as in the dict torch.load returns.
StateDict state_dict_of(const PyValue& root, const std::string& path) {
  if (root.kind != PyValue::Kind::kDict) {
    throw Error(path + ": holds a pickled object, not a dict of tensors (save model.state_dict())");
  }
  std::vector<std::pair<std::string, const PyValue*>> items;
  std::map<std::string, std::size_t> place;
  for (const auto& [key, value] : root.dict) {
    if (key->kind != PyValue::Kind::kString) {
      throw Error(path + ": a state_dict key that is not a string");
    }
    const auto [at, added] = place.emplace(key->string, items.size());
    if (added) {
      items.emplace_back(key->string, value.get());
    } else {
      items[at->second].second = value.get();
    }
  }
  StateDict out;
  for (const auto& [key, value] : items) {
    if (value->kind == PyValue::Kind::kDict && (key == "state_dict" || key == "model")) {
      return state_dict_of(*value, path);
    }
    if (value->kind != PyValue::Kind::kTensor) {
      throw Error(path + ": '" + key + "' is not a tensor (save model.state_dict())");
    }
    out.emplace_back(key, value->tensor);
  }
  return out;
}

}  // namespace

StateDict read_torch_save(const std::vector<ZipEntry>& entries,
                          const std::string& path,
                          const ReleasePages& release) {
  const auto damaged = [&path](const std::string& why) {
    return Error(path + ": damaged weights file (" + why + ")");
  };
  const ZipEntry* pickle = find_entry(entries, "data.pkl");
  if (!pickle) throw Error(path + ": a zip archive without data.pkl, not a torch.save file");
  if (pickle->size > kMaxPickleBytes) {
    throw Error(path + ": a state_dict's pickle of " + std::to_string(pickle->size) +
                " bytes, more than the " + std::to_string(kMaxPickleBytes >> 20) +
                " MiB flowtrain reads");
  }
  std::vector<std::uint8_t> pickle_bytes(static_cast<std::size_t>(pickle->size));
  if (const std::string problem = read_entry(*pickle, pickle_bytes); !problem.empty()) {
    throw damaged(problem);
  }
  StateDictUnpickler unpickler(pickle_bytes, entries, release, path);
  StateDict out = state_dict_of(*unpickler.run(), path);
  // The entries no storage read (the version, newer PyTorch's byte order...): their CRCs too.
  for (const ZipEntry& entry : entries) {
    if (&entry == pickle || unpickler.read_entries().count(&entry)) continue;
    if (const std::string problem = entry_problem(entry, release); !problem.empty()) {
      throw damaged(problem);
    }
  }
  return out;
}

}  // namespace flowtrain::train
