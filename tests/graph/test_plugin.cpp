#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "graph/config.hpp"
#include "graph/error.hpp"
#include "graph/plugin.hpp"
#include "graph/registry.hpp"
#include "tests/temp_dir.hpp"

using namespace flowtrain;

// FLOWTRAIN_PRIME_STAGES, FLOWTRAIN_DUPLICATE_PLUGIN: the libraries' paths (tests/CMakeLists.txt).

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
