// The fuzz smoke run that `make test` does without clang: a fuzz target's LLVMFuzzerTestOneInput
// fed its seed corpus, then deterministic mutants of each seed (bit flips, byte overwrites,
// truncations, repeated and deleted chunks: libFuzzer's simplest moves) until --runs or
// --seconds. A crash, a sanitizer report or an escaping exception ends the process; the input
// that did it is saved first (--save, default ./fuzz-smoke-crash) so it can be replayed:
//   fuzz_image tests/fuzz/corpus/image --runs 2000 --seconds 20
//   fuzz_image ./fuzz-smoke-crash            # replays one file (or a folder) and nothing else
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "stages/data/splitmix.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

// The input being run, for the crash handler (async-signal-safe: raw pointer, write(2)).
const std::uint8_t* g_input = nullptr;
std::size_t g_input_size = 0;
char g_save_path[4096] = "fuzz-smoke-crash";

extern "C" void save_input(int signal) {
  const int fd = ::open(g_save_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    for (std::size_t done = 0; done < g_input_size;) {
      const ssize_t n = ::write(fd, g_input + done, g_input_size - done);
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    ::close(fd);
  }
  static const char kLine[] = "fuzz smoke: crash; the input is saved in ";
  [[maybe_unused]] ssize_t n = ::write(2, kLine, sizeof kLine - 1);
  n = ::write(2, g_save_path, std::strlen(g_save_path));
  n = ::write(2, "\n", 1);
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

void run(const Bytes& input) {
  g_input = input.data();
  g_input_size = input.size();
  LLVMFuzzerTestOneInput(input.data(), input.size());
}

Bytes read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// One of libFuzzer's simple mutations of `seed`, chosen by `draw`.
Bytes mutate(const Bytes& seed, std::uint64_t draw) {
  Bytes out = seed;
  const auto next = [&draw] { return draw = flowtrain::data::splitmix64(draw); };
  const std::size_t moves = 1 + next() % 4;
  for (std::size_t m = 0; m < moves; ++m) {
    if (out.empty()) {
      out.push_back(static_cast<std::uint8_t>(next()));
      continue;
    }
    const std::size_t at = next() % out.size();
    switch (next() % 6) {
      case 0:  // flip a bit
        out[at] ^= static_cast<std::uint8_t>(1u << (next() % 8));
        break;
      case 1:  // overwrite a byte (often with an edge value)
        out[at] = static_cast<std::uint8_t>(
            std::array<std::uint64_t, 4>{0, 0xff, 0x7f, next()}[next() % 4]);
        break;
      case 2:  // truncate
        out.resize(at);
        break;
      case 3: {  // delete a chunk
        const std::size_t n = std::min<std::size_t>(1 + next() % 64, out.size() - at);
        out.erase(out.begin() + static_cast<std::ptrdiff_t>(at),
                  out.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      case 4: {  // repeat a chunk
        const std::size_t n = std::min<std::size_t>(1 + next() % 64, out.size() - at);
        const Bytes chunk(out.begin() + static_cast<std::ptrdiff_t>(at),
                          out.begin() + static_cast<std::ptrdiff_t>(at + n));
        out.insert(out.begin() + static_cast<std::ptrdiff_t>(at), chunk.begin(), chunk.end());
        break;
      }
      default:  // a 32-bit field set to an edge value (sizes, offsets, counts)
        for (std::size_t b = 0; b < 4 && at + b < out.size(); ++b) {
          out[at + b] = static_cast<std::uint8_t>(
              (std::array<std::uint32_t, 4>{0, 0xffffffffu, 0x7fffffffu, 0x80000000u}[next() % 4] >>
               (8 * b)));
        }
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  long runs = 0;  // 0: replay the inputs only
  double seconds = 60;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--runs" && i + 1 < argc) {
      runs = std::stol(argv[++i]);
    } else if (arg == "--seconds" && i + 1 < argc) {
      seconds = std::stod(argv[++i]);
    } else if (arg == "--save" && i + 1 < argc) {
      std::snprintf(g_save_path, sizeof g_save_path, "%s", argv[++i]);
    } else if (arg.starts_with("-")) {
      std::cerr << "usage: " << argv[0]
                << " [--runs N] [--seconds S] [--save FILE] CORPUS_DIR_OR_FILE...\n";
      return 2;
    } else {
      inputs.emplace_back(arg);
    }
  }
  std::vector<Bytes> seeds;
  for (const fs::path& input : inputs) {
    std::vector<fs::path> files;
    if (fs::is_directory(input)) {
      for (const auto& entry : fs::directory_iterator(input)) files.push_back(entry.path());
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(input);
    }
    for (const fs::path& f : files) seeds.push_back(read_file(f));
  }
  if (seeds.empty()) {
    std::cerr << argv[0] << ": no inputs\n";
    return 2;
  }
  for (const int s : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) ::signal(s, save_input);

  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  long executed = 0;
  for (const Bytes& seed : seeds) {
    run(seed);
    ++executed;
  }
  for (long r = 0; r < runs && elapsed() < seconds; ++r, ++executed) {
    const Bytes& seed = seeds[static_cast<std::size_t>(r) % seeds.size()];
    run(mutate(seed, static_cast<std::uint64_t>(r) * 0x9E3779B97F4A7C15ull + 1));
  }
  std::cout << fs::path(argv[0]).filename().string() << ": " << seeds.size() << " seeds, "
            << executed << " inputs run in " << static_cast<int>(elapsed() * 1000)
            << " ms, no crash\n";
  return 0;
}
