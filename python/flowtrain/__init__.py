"""flowtrain from Python: its graph as a loader for a PyTorch loop, stages written in Python,
and whole runs driven from a script or a notebook. See docs/python.md.

    import flowtrain
    loader = flowtrain.Loader("graph.yaml", ["stages.files.params.epochs=3"], output="collate")
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:          # a dict of tensors viewing flowtrain's batch buffers
            train_step(batch["images"], batch["labels"])
"""

import atexit
import json
import weakref

import torch  # noqa: F401  (first: the extension hands over torch tensors)

from ._flowtrain import Error, _Loader, _add_stage, _run, _stages

__all__ = ["Error", "Loader", "run", "stage", "stages"]

_live_loaders = weakref.WeakSet()


class Loader:
    """Runs the stages of a YAML graph that `output` depends on, in background threads, and
    yields `output`'s batches in order: a dict with `images` [B, C, H, W] float32, `labels` [B]
    int64, `targets` [B, T] float32, `index` and `epoch` [B] int64, `paths`, and
    `teacher_logits` / `teacher_regression` where a teacher stage made them.

    Zero-copy: `images` views the buffer of the batch pool of the stage that filled it
    (collate's or decode_crop's `pool_size`); the buffer is reused only once Python has dropped
    every tensor viewing it, so a batch you keep is never overwritten. Keeping more images than
    the pool holds stalls the graph until its `wait_timeout_s`; keep `.clone()`s instead.

    Each `for` is the next epoch of its source over this rank's shard (under torchrun or Slurm,
    each process reads its own, as DistributedSampler would), and yields exactly its samples,
    as a DataLoader does: `len(loader)` batches, the last one partial unless `drop_last`. The
    source's `epochs` param is how many epochs there are. `rollover=True` gives the batches of
    `flowtrain run` over the same config instead: one graph streams every epoch, and the batch
    that straddles an epoch's end belongs to the next epoch.
    A loop that breaks out leaves the loader after the last batch it yielded: the next `for`
    goes on from there. `set_epoch(e)` for another epoch restarts at e's first sample;
    `state_dict()` / `load_state_dict()` resume at the exact next batch.

    Args:
        config: a flowtrain YAML config (one graph, or `phases:`).
        overrides: "key.path=value" strings, as on flowtrain's command line.
        output: the stage whose batches to yield; the stages after it are not run.
        phase: the phase of a multi-phase config (default: the first that has `output`).
        prefetch: batches made ready ahead of the loop.
        drop_last: True leaves out each epoch's last batch if it is partial, False keeps it;
            None (the default): as the batching stage's `drop_last` param says (false unless
            set).
        rollover: the batches of `flowtrain run` (see above), for a loop that must train on
            exactly what flowtrain's own train_step does.
        progress: a tqdm progress bar on stderr for each `for` (python3-tqdm).
    """

    def __init__(self, config, overrides=(), output="collate", phase="", prefetch=2,
                 drop_last=None, rollover=False, progress=False):
        self._loader = _Loader(str(config), list(overrides), output, phase, prefetch, rollover,
                               drop_last)
        self._progress = progress
        self._closed = False
        _live_loaders.add(self)

    def __len__(self):
        """Batches of one epoch on this rank (with rollover, about as many); 0 when a stage
        cannot tell ahead."""
        return self._loader.size()

    def __iter__(self):
        return self._with_progress() if self._progress else self

    def _with_progress(self):
        from tqdm import tqdm

        epoch = self._loader.state()[0]
        with tqdm(total=len(self) or None, desc=f"epoch {epoch}", unit="batch") as bar:
            while True:
                try:
                    batch = self.__next__()
                except StopIteration:
                    return
                bar.update(1)
                yield batch
                del batch  # the loop's reference alone keeps its buffer

    def __next__(self):
        if self._closed:
            raise Error("Loader: closed (close(), or the end of its `with` block): it gives no "
                        "more batches; make a new Loader")
        return self._loader.next()

    def set_epoch(self, epoch):
        """The next `for` runs epoch `epoch` from its first sample (its shuffle order and
        augmentation draws, as DistributedSampler.set_epoch picks them); for the epoch the
        loader is in, nothing changes."""
        self._loader.set_epoch(epoch)

    def state_dict(self):
        """Where the loader stands: the epoch, and the source position after the last batch it
        yielded. load_state_dict() of it makes the next batch the one that would have come."""
        epoch, position = self._loader.state()
        return {"flowtrain_loader": 1, "epoch": epoch, "position": position}

    def load_state_dict(self, state):
        """Makes the next batch the one that came after `state` (a dict from state_dict());
        anything else is refused in one line, the loader unchanged."""
        keys = {"flowtrain_loader", "epoch", "position"}
        if (not isinstance(state, dict) or set(state) != keys
                or not all(type(state[k]) is int for k in keys) or state["flowtrain_loader"] != 1):
            raise Error("Loader.load_state_dict: not a flowtrain loader state (a dict from "
                        "Loader.state_dict(): 'flowtrain_loader': 1, 'epoch' and 'position' "
                        "as ints)")
        if not (0 <= state["epoch"] < 2**32 and 0 <= state["position"] < 2**63):
            raise Error("Loader.load_state_dict: epoch " + str(state["epoch"]) + " and position " +
                        str(state["position"]) + " are not a loader's (whole numbers >= 0)")
        self._loader.restore(state["epoch"], state["position"])

    def report(self):
        """The report of the graph's run once it ended (close()), as a dict (the stages' busy,
        starved and blocked time, the verdict), or None. The node named `python` is this
        loader's end of the graph: busy there means the loop is slower than the graph."""
        text = self._loader.report_json()
        return None if text is None else json.loads(text)

    def close(self):
        """Stops the running epoch's graph and waits for it (dropping the loader does too); a
        closed loader gives no more batches."""
        self._closed = True
        self._loader.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        loader = getattr(self, "_loader", None)
        if loader is not None:
            loader.stop()


@atexit.register
def _stop_loaders():
    for loader in list(_live_loaders):
        loader.close()


def stage(type, item="batch", doc=None):
    """Registers a Python callable as a map stage named `type`, usable from YAML like any
    built-in (`- {type: my_augment, concurrency: 2}`). It takes the item as a dict and returns
    it (changed in place or new), or None to drop it:

        @flowtrain.stage("brighten", item="sample")
        def brighten(sample):   # sample["image"]: uint8 [H, W, C], changed in place
            sample["image"].mul_(2)
            return sample

    item: "batch" (the dict a Loader yields; images, labels, targets may be replaced) or
    "sample" (one decoded image: image, label, targets, index, epoch, path). It runs under the
    GIL, `concurrency` calls at once; the report shows its busy/starved/blocked time like any
    node's. Registering the same type again replaces the callable."""

    def register(fn):
        summary = doc or (fn.__doc__ or "").strip().split("\n")[0] or f"python: {fn.__name__}"
        _add_stage(type, fn, item, summary)
        return fn

    return register


def stages():
    """The registered stage types: type, kind, item types, summary and params (name, type,
    default, doc), as `flowtrain stages` lists them."""
    return _stages()


def run(config, overrides=(), phases=(), timeout_s=300.0):
    """Runs a config's phases as `flowtrain run CONFIG OVERRIDES` does (printing its reports)
    and returns the run's report as a dict: {"phases": [...], "stopped": ...}, the same JSON
    `flowtrain run --report FILE` writes. Ctrl-C stops the running phase at the next item and
    raises KeyboardInterrupt."""
    report = json.loads(_run(str(config), list(overrides), list(phases), timeout_s))
    if report.get("stopped") and "SIGINT" in report["stopped"]:
        raise KeyboardInterrupt(report["stopped"])
    return report
