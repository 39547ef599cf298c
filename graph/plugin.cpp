#include "graph/plugin.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "graph/error.hpp"

namespace flowtrain {

namespace detail {
std::vector<StageInfo>*& pending_registrations() {
  thread_local std::vector<StageInfo>* pending = nullptr;
  return pending;
}
}  // namespace detail

namespace {

// Resets the pending registrations when the library's initialisers are done, or threw.
class CollectRegistrations {
 public:
  explicit CollectRegistrations(std::vector<StageInfo>& into) {
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

  Registry& registry = Registry::global();  // built before its add() may defer (registry.cpp)
  std::vector<StageInfo> pending;
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
  std::string problem;
  std::set<std::string> seen;
  for (const StageInfo& info : pending) {
    if (registry.find(info.type) || !seen.insert(info.type).second) {
      problem = "it registers stage type '" + info.type +
                "', which is registered already (by flowtrain, another plugin or itself); "
                "rename it";
      break;
    }
    types.push_back(info.type);
  }
  if (pending.empty()) {
    problem =
        "it registers no stage type (no FLOWTRAIN_REGISTER_STAGE, or the library was loaded "
        "already, linked into the program)";
  }
  if (!problem.empty()) {
    pending.clear();  // their functions are the library's code: gone before it is unloaded
    ::dlclose(handle);
    throw fail(problem);
  }
  for (StageInfo& info : pending) registry.add(std::move(info));
  std::sort(types.begin(), types.end());
  loaded.emplace(handle, types);
  return types;
}

}  // namespace flowtrain
