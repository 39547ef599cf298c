#pragma once

// Internal to graph/'s config rooms: the words of a message about what a config got wrong.

#include <string>
#include <vector>

#include "graph/params.hpp"

namespace flowtrain::detail {

/// "a, b, c".
std::string join(const std::vector<std::string>& items);
/// " (one of: a, b)", or for a path " (one of: a, b, or a file)".
std::string choices_text(const ParamSpec& p);
/// "stage 'decode' (jpeg_decode): ".
std::string stage_label(const std::string& name, const std::string& type);
/// "phase 'distill': " for a phase of a multi-phase config, "" for a single pipeline.
std::string phase_label(const std::string& name);
/// " (did you mean 'quality'?)" when a candidate is close, else a list of what is allowed.
std::string suggestion(const std::string& given, const std::vector<std::string>& candidates);

}  // namespace flowtrain::detail
