// flowtrain._flowtrain: the Python face of flowtrain (python/flowtrain/__init__.py wraps it).
// Batches cross as torch tensors viewing the batch pool's buffers; the pool gets a buffer back
// when Python lets go of the last tensor viewing it. The GIL is released whenever C++ waits or
// works, and taken only to run Python (a stage written in it, a conversion).

#include <ATen/Functions.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "graph/error.hpp"
#include "graph/registry.hpp"
#include "graph/report_io.hpp"
#include "python/src/loader.hpp"
#include "runner/run_phases.hpp"
#include "stages/data/batch.hpp"
#include "stages/data/sample.hpp"

namespace py = pybind11;

namespace flowtrain::python {

namespace {

// A tensor of `t`'s data, shape and strides that keeps `owner` alive while it lives.
at::Tensor view_owned(const at::Tensor& t, std::shared_ptr<const void> owner) {
  if (!t.defined()) return t;
  return at::from_blob(
      t.data_ptr(), t.sizes(), t.strides(), [owner = std::move(owner)](void*) {}, t.options());
}

at::Tensor long_tensor(const std::vector<data::ViewKey>& views, bool epoch) {
  at::Tensor out = at::empty({static_cast<std::int64_t>(views.size())}, at::kLong);
  auto* p = out.data_ptr<std::int64_t>();
  for (std::size_t i = 0; i < views.size(); ++i) {
    p[i] = static_cast<std::int64_t>(epoch ? views[i].epoch : views[i].index);
  }
  return out;
}

// The batch as a dict. Its images are a view that holds the batch, and so its lease: the
// buffer is reused only once Python dropped it. Labels and targets are copies (a few hundred
// bytes), so that a loop keeping them (`torch.cat([b["labels"] for b in loader])`) holds no
// buffer.
py::dict to_dict(data::Batch batch) {
  auto held = std::make_shared<const data::Batch>(std::move(batch));
  const data::Batch& b = *held;
  py::dict d;
  d["images"] = view_owned(b.images, held);
  d["labels"] = b.labels.clone();
  d["targets"] = b.targets.clone();
  d["index"] = long_tensor(b.views, false);
  d["epoch"] = long_tensor(b.views, true);
  py::list paths;
  for (const std::string& p : b.paths) paths.append(p);
  d["paths"] = paths;
  if (b.teacher_logits.defined()) d["teacher_logits"] = b.teacher_logits;
  if (b.teacher_regression.defined()) d["teacher_regression"] = b.teacher_regression;
  if (b.label_mix.defined()) d["label_mix"] = b.label_mix;
  if (b.mix_partner.defined()) d["mix_partner"] = b.mix_partner;
  return d;
}

// Reads back what a Python stage changed of a batch: the tensors it returned, checked.
void from_dict(const py::dict& d, data::Batch& b, const std::string& stage) {
  const std::int64_t rows = static_cast<std::int64_t>(b.views.size());
  auto take = [&](const char* key, at::Tensor& into, at::ScalarType type, std::int64_t dims) {
    if (!d.contains(key) || d[key].is_none()) return;
    at::Tensor t;
    try {
      t = d[key].cast<at::Tensor>();
    } catch (const py::cast_error&) {
      throw Error("python stage '" + stage + "' returned '" + key + "' as " +
                  std::string(py::str(d[key].get_type().attr("__name__"))) + ", not a tensor");
    }
    if (t.scalar_type() != type || t.dim() != dims || t.size(0) != rows) {
      std::ostringstream got;
      got << t.scalar_type() << " " << t.sizes();
      throw Error("python stage '" + stage + "' returned '" + key + "' as " + got.str() +
                  ", expected " + std::string(c10::toString(type)) + " with " +
                  std::to_string(dims) + " dims and " + std::to_string(rows) + " rows");
    }
    // The stages after it were built for the images it was given: their size stays.
    if (dims == 4 && into.defined() && t.sizes() != into.sizes()) {
      std::ostringstream got;
      got << "'" << key << "' as " << t.sizes() << ", expected " << into.sizes();
      throw Error("python stage '" + stage + "' returned " + got.str() +
                  " (the size it was given, which the stages after it take)");
    }
    if (t.requires_grad()) {
      throw Error("python stage '" + stage + "' returned '" + key +
                  "' as a tensor that requires grad; the stages after it take data: return it "
                  "detached (.detach(), or compute it under torch.no_grad())");
    }
    into = t.contiguous();
  };
  take("images", b.images, at::kFloat, 4);
  take("labels", b.labels, at::kLong, 1);
  take("targets", b.targets, at::kFloat, 2);
  take("teacher_logits", b.teacher_logits, at::kFloat, 2);
  take("teacher_regression", b.teacher_regression, at::kFloat, 2);
}

// The sample as a dict: its pixels an [H, W, C] uint8 view (None before decode).
py::dict to_dict(const std::shared_ptr<data::Sample>& s) {
  py::dict d;
  if (s->image.empty()) {
    d["image"] = py::none();
  } else {
    const at::Tensor pixels = at::from_blob(
        s->image.pixels.data(), {s->image.height, s->image.width, s->image.channels}, [s](void*) {},
        at::kByte);
    d["image"] = pixels;
  }
  d["label"] = s->label;
  d["targets"] = s->targets;
  d["index"] = s->index;
  d["epoch"] = s->epoch;
  d["path"] = s->path;
  return d;
}

void from_dict(const py::dict& d,
               const std::shared_ptr<data::Sample>& s,
               data::Sample& out,
               const std::string& stage) {
  // A copy: a tensor Python kept may still view the pixels of `s`, which it holds alive.
  out = *s;
  if (d.contains("label")) out.label = d["label"].cast<std::int64_t>();
  if (d.contains("targets")) out.targets = d["targets"].cast<std::vector<float>>();
  if (!d.contains("image") || d["image"].is_none()) return;
  const at::Tensor t = d["image"].cast<at::Tensor>();
  if (t.scalar_type() != at::kByte || t.dim() != 3) {
    std::ostringstream got;
    got << t.scalar_type() << " " << t.sizes();
    throw Error("python stage '" + stage + "' returned 'image' as " + got.str() +
                ", expected uint8 [height, width, channels]");
  }
  if (t.data_ptr() == static_cast<const void*>(s->image.pixels.data()) &&
      t.size(0) == out.image.height && t.size(1) == out.image.width && t.is_contiguous()) {
    return;  // changed in place (or not at all): copied with the rest
  }
  const at::Tensor c = t.contiguous();
  out.image.height = static_cast<int>(c.size(0));
  out.image.width = static_cast<int>(c.size(1));
  out.image.channels = static_cast<int>(c.size(2));
  out.image.pixels.assign(c.data_ptr<std::uint8_t>(), c.data_ptr<std::uint8_t>() + c.numel());
}

// A Python exception as one line: "ValueError: bad crop (augment.py:12)".
std::string one_line(const py::error_already_set& e) {
  std::string line =
      std::string(py::str(e.type().attr("__name__"))) + ": " + std::string(py::str(e.value()));
  if (e.trace()) {
    py::handle tb = e.trace();
    while (!tb.attr("tb_next").is_none()) tb = tb.attr("tb_next");
    const py::handle code = tb.attr("tb_frame").attr("f_code");
    line += " (" + std::string(py::str(code.attr("co_filename"))) + ":" +
            std::string(py::str(tb.attr("tb_lineno"))) + ")";
  }
  std::replace(line.begin(), line.end(), '\n', ' ');
  return line;
}

// The Python callables registered as stages, by type; a type registered again gets the new one.
struct PythonStages {
  std::mutex mutex;
  std::map<std::string, py::object> callables;
};
PythonStages& python_stages() {
  static auto* stages = new PythonStages;  // never destroyed: outlives the interpreter's objects
  return *stages;
}

// The threads inside a Python stage's call, by Python thread id; touched only under the GIL.
// Ctrl-C in the loop raises KeyboardInterrupt in them too, so that a stage's Python code stops
// at its next line rather than when the call returns (a single C call, time.sleep(30) say, still
// runs to its end: CPython checks for it between lines).
// A vector, as few as the graph's threads: once grown, an item allocates nothing here.
std::vector<unsigned long>& threads_in_stages() {
  static auto* threads = new std::vector<unsigned long>;  // never destroyed, as python_stages()
  return *threads;
}
struct InPythonStage {
  const unsigned long thread = PyThread_get_thread_ident();
  InPythonStage() { threads_in_stages().push_back(thread); }
  ~InPythonStage() {
    std::vector<unsigned long>& threads = threads_in_stages();
    threads.erase(std::find(threads.begin(), threads.end(), thread));
    PyThreadState_SetAsyncExc(thread, nullptr);  // one that came too late is not left behind
  }
};
void interrupt_python_stages() {
  for (const unsigned long thread : threads_in_stages()) {
    PyThreadState_SetAsyncExc(thread, PyExc_KeyboardInterrupt);
  }
}

// A Python callable as a map stage of items of type T (a Batch or a Sample), under the GIL.
template <class T>
class PythonStage final : public Map<T, T> {
 public:
  PythonStage(std::string type, py::object fn) : type_(std::move(type)), fn_(std::move(fn)) {}
  ~PythonStage() override {
    py::gil_scoped_acquire gil;
    fn_ = py::object();
  }

 protected:
  std::optional<T> process(T&& item, ItemContext& ctx) override {
    py::gil_scoped_acquire gil;
    const InPythonStage in_stage;
    try {
      if constexpr (std::is_same_v<T, data::Batch>) {
        const py::dict given = to_dict(item);
        const py::list keys = py::list(given.attr("keys")());  // before the function changes the dict
        const py::object result = fn_(given);
        if (result.is_none()) return ctx.drop("python stage '" + type_ + "' returned None");
        from_dict(checked_dict(result, keys), item, type_);
        return std::move(item);
      } else {
        auto held = std::make_shared<T>(std::move(item));
        const py::dict given = to_dict(held);
        const py::list keys = py::list(given.attr("keys")());
        const py::object result = fn_(given);
        if (result.is_none()) return ctx.drop("python stage '" + type_ + "' returned None");
        T out;
        from_dict(checked_dict(result, keys), held, out, type_);
        return out;
      }
    } catch (py::error_already_set& e) {
      throw Error(one_line(e));
    }
  }

 private:
  // The dict a stage returned, holding every key of the one it was given (a key left out would
  // silently keep the old value).
  py::dict checked_dict(const py::object& result, const py::list& given) const {
    if (!py::isinstance<py::dict>(result)) {
      throw Error("python stage '" + type_ + "' returned " +
                  std::string(py::str(result.get_type().attr("__name__"))) +
                  ", expected the dict it was given (or None to drop the item)");
    }
    py::dict out = result.cast<py::dict>();
    for (const py::handle key : given) {
      if (!out.contains(key)) {
        throw Error("python stage '" + type_ + "' returned a dict without '" +
                    std::string(py::str(key)) +
                    "': return the dict it was given, changed (or None to drop the item)");
      }
    }
    return out;
  }
  std::string type_;
  py::object fn_;
};

template <class T>
void register_python_stage(const std::string& type, const std::string& summary) {
  StageShape shape = Map<T, T>::static_shape();
  Registry::global().add(
      StageInfo{type,
                {.summary = summary},
                shape,
                [type](const Params&, const BuildContext&) -> std::unique_ptr<Stage> {
                  py::gil_scoped_acquire gil;
                  std::lock_guard lock(python_stages().mutex);
                  return std::make_unique<PythonStage<T>>(type, python_stages().callables.at(type));
                }});
}

void add_stage(const std::string& type,
               py::object fn,
               const std::string& item,
               const std::string& summary) {
  std::lock_guard lock(python_stages().mutex);
  auto& callables = python_stages().callables;
  if (!callables.count(type)) {
    if (Registry::global().find(type)) {
      throw Error("flowtrain.stage: type '" + type + "' is already a stage of flowtrain (" +
                  Registry::global().find(type)->doc.summary + "); pick another name");
    }
    if (item == "batch") {
      register_python_stage<data::Batch>(type, summary);
    } else if (item == "sample") {
      register_python_stage<data::Sample>(type, summary);
    } else {
      throw Error("flowtrain.stage: item must be 'batch' or 'sample', got '" + item + "'");
    }
  } else {
    const bool batch = Registry::global().find(type)->shape.input.id == typeid(data::Batch);
    if (item != (batch ? "batch" : "sample")) {
      throw Error("flowtrain.stage: '" + type + "' was registered for " +
                  (batch ? "batches" : "samples") + "; a stage keeps its item type");
    }
  }
  callables[type] = std::move(fn);
}

py::list stages() {
  py::list out;
  for (const StageInfo* info : Registry::global().all()) {
    py::list params;
    for (const ParamSpec& p : info->doc.params) {
      py::dict d;
      d["name"] = p.name;
      d["type"] = to_string(p.type);
      d["default"] = p.default_text();
      d["doc"] = p.doc;
      params.append(d);
    }
    py::dict d;
    d["type"] = info->type;
    d["kind"] = to_string(info->shape.kind);
    d["takes"] = info->shape.input.name();
    d["gives"] = info->shape.output.name();
    d["summary"] = info->doc.summary;
    d["params"] = params;
    out.append(d);
  }
  return out;
}

// Runs a config's phases as `flowtrain run` does; the report as JSON text. A signal stops the
// run at the next item, and the report says so.
std::string run(const std::string& config_path,
                const std::vector<std::string>& overrides,
                const std::vector<std::string>& phases,
                double timeout_s) {
  RunConfig config = load_run_config(config_path, overrides);
  runner::PhasesOutcome outcome;
  {
    py::gil_scoped_release release;
    outcome = runner::run_phases(config, {.config_path = config_path,
                                        .overrides = overrides,
                                        .timeout_s = timeout_s,
                                        .phases = phases});
  }
  return run_report_json(
      outcome.reports,
      {.config = config_path, .overrides = overrides, .stopped = outcome.stopped.value_or("")});
}

// Waits for the next batch without the GIL, a slice at a time, so that Ctrl-C is seen: Python's
// handler raises KeyboardInterrupt here at once. The graph is told to stop and its Python stages
// are interrupted; close(), or the next loop, waits for it to end.
py::object next_batch(Loader& loader) {
  for (;;) {
    data::Batch batch;
    Loader::Next next;
    {
      py::gil_scoped_release release;
      next = loader.next(batch, 0.05);
    }
    if (next == Loader::Next::kBatch) return to_dict(std::move(batch));
    if (next == Loader::Next::kEnd) throw py::stop_iteration();
    if (PyErr_CheckSignals() != 0) {
      py::error_already_set interrupted;  // holds the KeyboardInterrupt while the graph is told
      interrupt_python_stages();
      loader.cancel();
      throw interrupted;
    }
  }
}

}  // namespace

}  // namespace flowtrain::python

PYBIND11_MODULE(_flowtrain, m) {
  using namespace flowtrain::python;
  namespace ft = flowtrain;
  m.doc() = "flowtrain's graph from Python: see python/flowtrain/__init__.py and docs/python.md";
  py::register_exception<ft::Error>(m, "Error", PyExc_RuntimeError);

  py::class_<Loader>(m, "_Loader")
      .def(py::init([](const std::string& config, std::vector<std::string> overrides,
                       std::string output, std::string phase, std::size_t prefetch,
                       bool rollover, std::optional<bool> drop_last) {
             return std::make_unique<Loader>(LoaderOptions{config, std::move(overrides),
                                                           std::move(output), std::move(phase),
                                                           prefetch, rollover, drop_last});
           }),
           py::arg("config"), py::arg("overrides"), py::arg("output"), py::arg("phase"),
           py::arg("prefetch"), py::arg("rollover"), py::arg("drop_last"))
      .def("size", &Loader::size, py::call_guard<py::gil_scoped_release>())
      .def("next", &next_batch)
      .def("stop", &Loader::stop, py::call_guard<py::gil_scoped_release>())
      .def("state",
           [](const Loader& l) { return std::make_pair(l.state().epoch, l.state().position); })
      .def("restore",
           [](Loader& l, std::uint32_t epoch, std::uint64_t position) {
             py::gil_scoped_release release;
             l.restore({epoch, position});
           })
      .def("set_epoch", &Loader::set_epoch, py::call_guard<py::gil_scoped_release>())
      .def("report_json", [](const Loader& l) -> py::object {
        if (!l.last_report()) return py::none();
        return py::str(ft::report_to_json(*l.last_report()));
      });

  m.def("_add_stage", &add_stage, py::arg("type"), py::arg("fn"), py::arg("item"),
        py::arg("summary"));
  m.def("_stages", &stages);
  m.def("_run", &run, py::arg("config"), py::arg("overrides"), py::arg("phases"),
        py::arg("timeout_s"));
}
