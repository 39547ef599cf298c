#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "apps/foodtag/commands/command.hpp"
#include "graph/atomic_file.hpp"
#include "stages/train/files/checkpoint.hpp"
#include "stages/train/models/compute.hpp"
#include "stages/train/models/model.hpp"
#include "stages/train/files/torchscript.hpp"

namespace foodtag {

using flowtrain::Params;

namespace {

using Clock = std::chrono::steady_clock;

// The number of parameters of a TorchScript module file.
std::int64_t torchscript_parameter_count(const std::string& path) {
  std::int64_t n = 0;
  for (const torch::Tensor& p : torch::jit::load(path).parameters()) n += p.numel();
  return n;
}

}  // namespace

int export_command(const Context& ctx) {
  check_output_dir(ctx);
  const std::string given_teacher = own_teacher(ctx.sections);
  if (given_teacher.empty()) check_model(ctx.teacher_checkpoint(), "train-teacher");
  check_model(ctx.student_checkpoint(), "distill");
  struct Exported {
    std::string name;
    fs::path path;
    std::int64_t parameters = 0;
    int image_size = 0;
    std::vector<double> batch_s, single_s;
  };
  std::vector<Exported> models;
  for (const auto& [name, checkpoint] : {std::pair{"teacher", ctx.teacher_checkpoint()},
                                         std::pair{"student", ctx.student_checkpoint()}}) {
    if (std::string(name) == "teacher" && !given_teacher.empty()) {
      // teacher.model is measured as it is: there is no checkpoint to export. Its input size
      // is its own `image_size` attribute if it has one, else the student's (set below).
      const flowtrain::train::ScriptedModel scripted(given_teacher);
      models.push_back({name, given_teacher, torchscript_parameter_count(given_teacher),
                        scripted.image_size().value_or(0)});
      std::cout << "teacher: " << given_teacher << " (teacher.model, " << models.back().parameters
                << " parameters, " << fs::file_size(given_teacher) / 1000 << " kB)\n";
      continue;
    }
    const flowtrain::train::Checkpoint c = flowtrain::train::read_checkpoint(checkpoint.string());
    flowtrain::train::ImageModel model = flowtrain::train::load_model(c);
    const fs::path out = ctx.out_dir / (std::string(name) + ".pt");
    flowtrain::train::export_torchscript(model, out.string());
    models.push_back({name, out, flowtrain::train::parameter_count(*model), c.config.image_size});
    std::cout << "wrote " << out.string() << " (" << models.back().parameters << " parameters, "
              << fs::file_size(out) / 1000 << " kB)\n";
  }
  if (models[0].image_size == 0) models[0].image_size = models[1].image_size;
  const Params& report = ctx.section("report");
  const auto batch = report.get_int("inference_batch");
  const auto reps = static_cast<int>(report.get_int("inference_reps"));
  const int cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  flowtrain::train::IntraOpThreads threads(cores);
  std::vector<std::unique_ptr<flowtrain::train::ScriptedModel>> loaded;
  for (const Exported& m : models) {
    loaded.push_back(std::make_unique<flowtrain::train::ScriptedModel>(m.path.string()));
  }
  auto time_forward = [&](std::size_t i, std::int64_t n) {
    const torch::Tensor images = torch::randn({n, 3, models[i].image_size, models[i].image_size});
    const auto begin = Clock::now();
    loaded[i]->forward(images);
    return std::chrono::duration<double>(Clock::now() - begin).count();
  };
  for (std::size_t i = 0; i < models.size(); ++i) time_forward(i, batch);  // warm-up
  for (int r = 0; r < reps; ++r) {
    for (std::size_t i = 0; i < models.size(); ++i) {
      models[i].batch_s.push_back(time_forward(i, batch));
      models[i].single_s.push_back(time_forward(i, 1));
    }
  }
  std::ostringstream yaml;
  yaml << "# written by foodtag export: inference on " << cores << " intra-op threads, batch "
       << batch << ", median of " << reps << " alternating repetitions\n";
  for (const Exported& m : models) {
    const double ips = static_cast<double>(batch) / median(m.batch_s);
    const double ms = median(m.single_s) * 1e3;
    yaml << m.name << ": {parameters: " << m.parameters
         << ", file_mb: " << static_cast<double>(fs::file_size(m.path)) / 1e6
         << ", images_per_s: " << ips << ", ms_per_image: " << ms << "}\n";
    char line[160];
    std::snprintf(line, sizeof line, "%s: %.1f images/s at batch %lld, %.1f ms for one image\n",
                  m.name.c_str(), ips, static_cast<long long>(batch), ms);
    std::cout << line;
  }
  const double speedup = median(models[0].batch_s) / median(models[1].batch_s);
  char line[160];
  std::snprintf(
      line, sizeof line, "student: %.1fx the teacher's throughput with %.1fx fewer parameters\n",
      speedup,
      static_cast<double>(models[0].parameters) / static_cast<double>(models[1].parameters));
  std::cout << line;
  flowtrain::write_file_atomically((ctx.out_dir / "models.yaml").string(), yaml.str());
  return 0;
}

}  // namespace foodtag
