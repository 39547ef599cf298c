#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace flowtrain {

/// The one exception type flowtrain throws for setup, config and run failures.
/// Its message already carries the context a user needs (file:line, stage, key, item).
///
///   throw Error("demo.yaml:12: stage 'decode' (jpeg_decode): unknown param 'qualty'");
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// An exception raised inside a running stage, rethrown from `Pipeline::run()` after the
/// graph was cancelled. Keeps the stage name and the id of the item being processed.
class StageError : public Error {
 public:
  StageError(std::string stage, std::uint64_t item, const std::string& what)
      : Error("stage '" + stage + "' failed on item " + std::to_string(item) + ": " + what),
        stage_(std::move(stage)),
        item_(item) {}

  const std::string& stage() const { return stage_; }
  std::uint64_t item() const { return item_; }

 private:
  std::string stage_;
  std::uint64_t item_;
};

}  // namespace flowtrain
