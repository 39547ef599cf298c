#pragma once

// One line from a LibTorch exception, for an error naming the file or stage it concerns.

#include <exception>
#include <string>

namespace flowtrain::train {

/// The first non-empty line of `message`.
std::string first_line(const std::string& message);

/// The message of `e` without the C++ backtrace a c10::Error appends.
std::string message_of(const std::exception& e);

/// What went wrong, in one line: a TorchScript interpreter error's last line (after its
/// traceback), else the message's first line.
///   catch (const std::exception& e) { throw Error(path + ": failed: " + short_reason(e)); }
std::string short_reason(const std::exception& e);

}  // namespace flowtrain::train
