#include "graph/plugin.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "graph/error.hpp"
#include "graph/read_file.hpp"

namespace flowtrain {

namespace detail {
PendingRegistrations*& pending_registrations() {
  thread_local PendingRegistrations* pending = nullptr;
  return pending;
}
}  // namespace detail

namespace {

// Why dlopen must not be given `file`, or "": dlopen maps the segments its program headers
// name, and touching a page past the end of a cut file is SIGBUS, not an error it returns.
// Reads the headers only (the file mapped, as this machine's class and byte order: ElfW).
std::string elf_problem(const std::string& file) {
  std::optional<MappedFile> mapped;
  try {
    mapped.emplace(file);
  } catch (const Error& e) {
    return e.what();
  }
  const std::span<const std::uint8_t> bytes = mapped->bytes();
  const std::uint64_t size = bytes.size();
  const auto damaged = [&](const std::string& what_ends, std::uint64_t end) {
    return "it is truncated or damaged (" + what_ends + " at byte " + std::to_string(end) +
           " of a file of " + std::to_string(size) + " bytes)";
  };
  // The end of `count` entries of `entry_size` bytes from `offset`; UINT64_MAX past 2^64.
  const auto end_of = [](std::uint64_t offset, std::uint64_t count, std::uint64_t entry_size) {
    if (entry_size != 0 && count > UINT64_MAX / entry_size) return UINT64_MAX;
    const std::uint64_t length = count * entry_size;
    return offset > UINT64_MAX - length ? UINT64_MAX : offset + length;
  };
  // A header of type T at `offset` (the caller checked it lies in the file).
  const auto read = [&]<class T>(T& into, std::uint64_t offset) {
    std::memcpy(&into, bytes.data() + offset, sizeof into);
  };

  ElfW(Ehdr) header{};
  if (size < SELFMAG || std::memcmp(bytes.data(), ELFMAG, SELFMAG) != 0) {
    return "not an ELF shared library";
  }
  if (size < sizeof header) return damaged("its ELF header ends", sizeof header);
  read(header, 0);
  constexpr unsigned char kClass = sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32;
  constexpr bool kLittle = std::endian::native == std::endian::little;
  if (header.e_ident[EI_CLASS] != kClass ||
      header.e_ident[EI_DATA] != (kLittle ? ELFDATA2LSB : ELFDATA2MSB)) {
    return "not an ELF shared library of this machine's kind (" +
           std::to_string(sizeof(void*) * 8) + "-bit, " + (kLittle ? "little" : "big") + "-endian)";
  }
  if (header.e_phentsize != sizeof(ElfW(Phdr)) || header.e_phnum == 0) {
    return "not an ELF shared library (no program headers)";
  }
  if (const std::uint64_t end = end_of(header.e_phoff, header.e_phnum, header.e_phentsize);
      end > size) {
    return damaged("its program headers end", end);
  }
  for (std::size_t i = 0; i < header.e_phnum; ++i) {
    ElfW(Phdr) segment{};
    read(segment, header.e_phoff + i * sizeof segment);
    if (const std::uint64_t end = end_of(segment.p_offset, 1, segment.p_filesz);
        segment.p_type == PT_LOAD && end > size) {
      return damaged("segment " + std::to_string(i) + " ends", end);
    }
  }
  if (const std::uint64_t end = end_of(header.e_shoff, header.e_shnum, header.e_shentsize);
      header.e_shoff != 0 && end > size) {
    return damaged("its section headers end", end);
  }
  return "";
}

// Resets the pending registrations when the library's initialisers are done.
class CollectRegistrations {
 public:
  explicit CollectRegistrations(detail::PendingRegistrations& into) {
    detail::pending_registrations() = &into;
  }
  ~CollectRegistrations() { detail::pending_registrations() = nullptr; }
  CollectRegistrations(const CollectRegistrations&) = delete;
  CollectRegistrations& operator=(const CollectRegistrations&) = delete;
};

}  // namespace

std::vector<std::string> load_plugin(const std::string& path) {
  namespace fs = std::filesystem;
  static std::mutex mutex;
  // By dlopen's handle: the same file loaded again (by another path, too) gives the same one.
  static std::map<void*, std::vector<std::string>> loaded;
  const std::lock_guard<std::mutex> lock(mutex);
  auto fail = [&](const std::string& reason) -> Error {
    return Error("cannot load plugin '" + path + "': " + reason);
  };

  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) throw fail("no such file");
  // Before dlopen reads it: reading a FIFO or a terminal waits for a writer.
  if (!fs::is_regular_file(status)) {
    throw fail(std::string("it is ") + (fs::is_directory(status) ? "a folder" : "a special file") +
               ", not a shared library");
  }
  // An absolute path: dlopen searches the library path for a name without a slash.
  const std::string file = fs::absolute(path, ec).lexically_normal().string();

  if (const std::string problem = elf_problem(file); !problem.empty()) throw fail(problem);

  Registry& registry = Registry::global();  // built before its add() may defer (registry.cpp)
  detail::PendingRegistrations pending;
  void* handle = nullptr;
  {
    const CollectRegistrations collect(pending);
    handle = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (!handle) {
    const char* reason = ::dlerror();
    throw fail(reason ? reason : "dlopen failed");
  }
  if (auto it = loaded.find(handle); it != loaded.end()) {
    ::dlclose(handle);  // one reference is enough
    return it->second;
  }

  std::vector<std::string> types;
  std::string problem = pending.problem;  // a registrar that threw
  std::set<std::string> seen;
  for (const StageInfo& info : pending.stages) {
    if (problem.empty() && (registry.find(info.type) || !seen.insert(info.type).second)) {
      problem = "it registers stage type '" + info.type +
                "', which is registered already (by flowtrain, another plugin or itself); "
                "rename it";
    }
    types.push_back(info.type);
  }
  if (problem.empty() && pending.stages.empty()) {
    problem =
        "it registers no stage type (no FLOWTRAIN_REGISTER_STAGE, or the library was loaded "
        "already, linked into the program)";
  }
  if (!problem.empty()) {
    pending.stages.clear();  // their functions are the library's code: gone before it is unloaded
    ::dlclose(handle);
    throw fail(problem);
  }
  for (StageInfo& info : pending.stages) registry.add(std::move(info));
  std::sort(types.begin(), types.end());
  loaded.emplace(handle, types);
  return types;
}

}  // namespace flowtrain
