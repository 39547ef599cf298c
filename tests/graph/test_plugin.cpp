#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/plugin.hpp"
#include "graph/registry.hpp"
#include "tests/temp_dir.hpp"

using namespace flowtrain;

// FLOWTRAIN_PRIME_STAGES, FLOWTRAIN_DUPLICATE_PLUGIN, FLOWTRAIN_THROWING_PLUGIN: the libraries'
// paths (tests/CMakeLists.txt).

namespace {

// The first `bytes` bytes of `from`, written to `to`.
void write_prefix(const std::string& from, std::size_t bytes, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(data.size() > bytes);
  std::ofstream(to, std::ios::binary).write(data.data(), static_cast<std::streamsize>(bytes));
}

std::string load_error(const std::string& path) {
  try {
    load_plugin(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("Plugin.Load.RegistersItsTypesAndLoadsOnce") {
  const std::vector<std::string> expected = {"count_primes", "is_palindrome", "is_prime",
                                             "join_facts"};
  CHECK(load_plugin(FLOWTRAIN_PRIME_STAGES) == expected);
  for (const std::string& type : expected) CHECK(Registry::global().find(type) != nullptr);
  // Again, and by a link to the same file: the types it registered, nothing registered twice.
  CHECK(load_plugin(FLOWTRAIN_PRIME_STAGES) == expected);
  testing::TempDir dir("plugin");
  std::filesystem::create_symlink(FLOWTRAIN_PRIME_STAGES, dir.path() / "libprimes.so");
  CHECK(load_plugin(dir.str("libprimes.so")) == expected);
}

TEST_CASE("Plugin.Refused.TypeRegisteredAlreadyRegistersNone") {
  const std::string path = FLOWTRAIN_DUPLICATE_PLUGIN;
  const std::string message = "cannot load plugin '" + path +
                              "': it registers stage type 'spin', which is registered already (by "
                              "flowtrain, another plugin or itself); rename it";
  CHECK_THROWS_WITH_AS(load_plugin(path), message.c_str(), Error);
  // Its other type is not registered either, and a second try says the same.
  CHECK(Registry::global().find("echo_from_a_refused_plugin") == nullptr);
  CHECK_THROWS_WITH_AS(load_plugin(path), message.c_str(), Error);
}

TEST_CASE("Plugin.Config.ListLoadedRelativeToTheConfigAndSavedAbsolute") {
  testing::TempDir dir("plugin-config");
  std::filesystem::create_symlink(FLOWTRAIN_PRIME_STAGES, dir.path() / "libprimes.so");
  const std::string config = dir.str("primes.yaml");
  std::ofstream(config) << "plugins: [libprimes.so]\n"
                           "stages:\n"
                           "  - {type: sequence, params: {count: 100}}\n"
                           "  - {type: is_prime}\n"
                           "  - {type: discard}\n";
  const RunConfig loaded = load_run_config(config);
  CHECK(loaded.phases.at(0).stages.at(1).type == "is_prime");
  // The effective text reads the same from any folder: the plugin's path is absolute.
  CHECK(loaded.effective_text.find("plugins: [" + dir.str("libprimes.so") + "]") !=
        std::string::npos);
  CHECK_THROWS_WITH_AS(
      load_run_config(config, {"plugins=[libprimes.so]"}),
      "override 'plugins=[libprimes.so]': cannot load plugin 'libprimes.so': no such file", Error);
}

TEST_CASE("Plugin.Refused.RegistrationThrowsNamesTypeAndReason" * doctest::timeout(30)) {
  // An exception out of dlopen's static initialisers would end the process (terminate).
  const std::string path = FLOWTRAIN_THROWING_PLUGIN;
  const std::string message = "cannot load plugin '" + path +
                              "': registering stage type 'unready' threw: no vocabulary file "
                              "next to the plugin";
  CHECK_THROWS_WITH_AS(load_plugin(path), message.c_str(), Error);
  CHECK(Registry::global().find("echo_before_a_throwing_one") == nullptr);
  CHECK(Registry::global().find("unready") == nullptr);
  CHECK_THROWS_WITH_AS(load_plugin(path), message.c_str(), Error);  // unloaded: runs again
}

TEST_CASE("Plugin.Refused.TruncatedOrNotElfBeforeDlopen" * doctest::timeout(30)) {
  // dlopen maps the segments the headers promise: past the end of a cut file, that was SIGBUS.
  testing::TempDir dir("plugin-cut");
  const std::string library = FLOWTRAIN_PRIME_STAGES;
  const std::size_t size = std::filesystem::file_size(library);
  const auto cut = [&](std::size_t bytes) {
    const std::string path = dir.str("cut-" + std::to_string(bytes) + ".so");
    write_prefix(library, bytes, path);
    return path;
  };
  const std::string half = cut(size / 2);
  const std::regex segment_past_the_end(
      "cannot load plugin '" + half +
      "': it is truncated or damaged \\(segment [0-9]+ ends at byte [0-9]+ of a file of " +
      std::to_string(size / 2) + " bytes\\)");
  CHECK(std::regex_match(load_error(half), segment_past_the_end));
  const std::string head = cut(100);
  const std::regex headers_past_the_end(
      "cannot load plugin '" + head +
      "': it is truncated or damaged \\(its program headers end at byte [0-9]+ of a file of 100 "
      "bytes\\)");
  CHECK(std::regex_match(load_error(head), headers_past_the_end));
  const std::string header = cut(40);
  CHECK(load_error(header) == "cannot load plugin '" + header +
                                  "': it is truncated or damaged (its ELF header ends at byte "
                                  "64 of a file of 40 bytes)");
  const std::string text = dir.str("notes.so");
  std::ofstream(text) << "not a library\n";
  CHECK(load_error(text) == "cannot load plugin '" + text + "': not an ELF shared library");
  // The whole library still loads.
  CHECK(!load_plugin(library).empty());
}
