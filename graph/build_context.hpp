#pragma once

#include <map>
#include <typeindex>
#include <typeinfo>

namespace flowtrain {

/// What a pipeline's builder hands each stage it makes: the services the run shares, found by
/// type, such as the job's process group when the run is one rank of several. A stage gets its
/// dependencies here when the graph is built, never through a global:
///
///   TrainStepStage(const Options& options, const BuildContext& context)
///       : world_(context.find<dist::World>()) {}  // nullptr: a single process
///
///   BuildContext context;
///   context.provide(world);
///   build_pipeline(phase, Registry::global(), context);
class BuildContext {
 public:
  /// Makes `service` available to the stages built with this context; it must outlive them.
  template <class T>
  BuildContext& provide(T& service) {
    services_[typeid(T)] = &service;
    return *this;
  }

  /// Marks the pipeline as a rehearsal: built only to time a layout (autotune, before the real
  /// run), its work thrown away. Its stages must leave nothing behind: they may read their
  /// files, but write, append to, lock or create none (no checkpoint, log or cache entry).
  BuildContext& set_rehearsal(bool rehearsal) {
    rehearsal_ = rehearsal;
    return *this;
  }
  bool rehearsal() const { return rehearsal_; }

  /// The service of type T, or nullptr if none was provided.
  template <class T>
  T* find() const {
    const auto it = services_.find(typeid(T));
    return it == services_.end() ? nullptr : static_cast<T*>(it->second);
  }

 private:
  std::map<std::type_index, void*> services_;
  bool rehearsal_ = false;
};

}  // namespace flowtrain
