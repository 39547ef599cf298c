#pragma once

#include <string>
#include <vector>

#include "graph/registry.hpp"

namespace flowtrain {

/// Loads a plugin: a shared library whose FLOWTRAIN_REGISTER_STAGEs add stage types to
/// Registry::global(), so that configs can use them without a `main` of their own. Returns the
/// types it registered, sorted. `flowtrain run|check|stages --plugin FILE` call it, and
/// load_run_config for each path of a config's top-level `plugins:` list (relative to the
/// config's folder), before it validates the stages:
///
///   plugins: [build/libprimes.so]
///   stages:
///     - {type: sequence, params: {count: 1000}}
///     - {type: is_prime}          # registered by libprimes.so
///
///   for (const std::string& type : flowtrain::load_plugin("build/libprimes.so")) ...
///
/// `path` is a file path (relative to the current folder), never searched for on the library
/// path. Loading a library that is loaded already (the same path, or a link to the same file)
/// returns the types it registered the first time and does nothing else. Throws Error, one line
/// naming `path` and the reason: no such file, not an ELF shared library, a file truncated or
/// damaged (its headers name bytes past its end: checked before dlopen maps them), dlopen's
/// reason (an undefined symbol), a library that registers no stage type, one whose
/// registration threw (the type and what it threw), or one that registers a type registered
/// already (by flowtrain or another plugin). When refused once dlopen ran, none of its types is
/// registered and the library is unloaded. (An exception from a static initialiser of its own,
/// not a registrar, still ends the process: dlopen cannot pass it on.)
///
/// A plugin links flowtrain::graph (and flowtrain::stages, ::data, ::train for what it uses of
/// them), which are shared libraries: its registrars fill the registry of the program that
/// loads it. The installed CMake package builds one with `flowtrain_add_plugin(NAME sources...)`
/// (apps/custom_stage/README.md). Call it before building pipelines, from one thread at a time
/// with anything else reading the registry.
std::vector<std::string> load_plugin(const std::string& path);

namespace detail {
/// What a plugin's registrars leave while load_plugin has dlopen run them.
struct PendingRegistrations {
  std::vector<StageInfo> stages;
  /// The first registrar that threw, and why ("registering stage type 'x' threw: ...").
  std::string problem;
};
/// While not null (on this thread), Registry::global().add() appends here instead of
/// registering, and register_stage() records what a registrar throws: load_plugin checks all
/// of a plugin's types before it registers any, since an exception must not leave the static
/// initialisers that dlopen runs (it would end the process).
PendingRegistrations*& pending_registrations();
}  // namespace detail

}  // namespace flowtrain
