#include "stages/train/files/torch_error.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>

namespace flowtrain::train {

std::string first_line(const std::string& message) {
  const std::size_t begin = std::min(message.find_first_not_of(" \n"), message.size());
  return message.substr(begin, message.find('\n', begin) - begin);
}

std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

// A TorchScript interpreter error starts with a traceback and ends with the actual error line;
// other LibTorch errors say what happened on their first line.
std::string short_reason(const std::exception& e) {
  const std::string message = message_of(e);
  if (message.find("Traceback of TorchScript") == std::string::npos) return first_line(message);
  const std::size_t end = message.find_last_not_of(" \n");
  if (end == std::string::npos) return first_line(message);
  const std::size_t newline = message.rfind('\n', end);
  const std::size_t begin = newline == std::string::npos ? 0 : newline + 1;
  std::string last = message.substr(begin, end + 1 - begin);
  // "RuntimeError: AssertionError: ...": the interpreter's wrapper of the script's own
  // exception says nothing more; keep the script's class.
  const std::string wrapper = "RuntimeError: ";
  const std::size_t colon = last.find(": ", wrapper.size());
  if (last.rfind(wrapper, 0) == 0 && colon != std::string::npos &&
      std::all_of(last.begin() + wrapper.size(), last.begin() + colon,
                  [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '.'; })) {
    last.erase(0, wrapper.size());
  }
  return last;
}

}  // namespace flowtrain::train
