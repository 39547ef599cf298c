"""flowtrain.Loader: zero-copy batches, kept batches, epochs, exact resume, ranks, shutdown."""

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import flowtrain


def epoch_of(loader):
    return [(b["index"].clone(), b["images"].clone()) for b in loader]


def test_batches_view_the_pool_and_reuse_its_buffers(graph):
    loader = flowtrain.Loader(graph(pool=3), output="collate", prefetch=1)
    pointers = set()
    for batch in loader:
        assert batch["images"].shape[1:] == (3, 32, 32) and batch["images"].dtype == torch.float32
        assert batch["labels"].dtype == torch.int64 and batch["index"].shape == batch["labels"].shape
        pointers.add(batch["images"].data_ptr())
        del batch
    # 5 batches through a pool of 3 buffers: no batch was copied into fresh memory.
    assert 1 <= len(pointers) <= 3


def test_a_kept_batch_is_never_overwritten(graph):
    loader = flowtrain.Loader(graph(batch=6, pool=3), output="collate", prefetch=1)
    it = iter(loader)
    kept = next(it)
    copy = {k: kept[k].clone() for k in ("images", "labels", "index")}
    later = [b["images"].data_ptr() for b in it]
    assert len(later) == len(loader) - 1 == 5
    assert kept["images"].data_ptr() not in later
    for key, value in copy.items():
        assert torch.equal(kept[key], value), key


def test_each_for_yields_its_epoch_as_a_dataloader_does(graph):
    loader = flowtrain.Loader(graph(batch=8), output="collate")
    stream = flowtrain.Loader(graph(batch=8), output="collate", rollover=True)
    assert len(loader) == 5  # ceil(36 / 8)
    epochs = [epoch_of(loader) for _ in range(4)]
    for got in epochs:
        assert [len(i) for i, _ in got] == [8, 8, 8, 8, 4] and len(got) == len(loader)
        assert sorted(torch.cat([i for i, _ in got]).tolist()) == list(range(36))
    assert epochs[0][0][0].tolist() != epochs[1][0][0].tolist()  # epoch 1 has its own order
    # Epoch 0's full batches are the stream's: the same samples, views and pixels.
    for (i0, x0), (i1, x1) in zip(epochs[0][:4], epoch_of(stream)):
        assert torch.equal(i0, i1) and torch.equal(x0, x1)
    with pytest.raises(flowtrain.Error, match=r"epoch 4 is past the 4 epoch\(s\)"):
        next(iter(loader))
    dropped = flowtrain.Loader(graph(batch=8), output="collate", drop_last=True)
    assert len(dropped) == 4
    for epoch in range(2):
        got = epoch_of(dropped)
        assert len(got) == 4 and all(torch.equal(a, b) for (a, _), (b, _) in zip(got, epochs[epoch]))


def test_a_slow_loop_is_named_as_what_sets_the_pace(graph):
    # The loop takes 0.15 s a batch; the graph makes one in milliseconds and then waits for room
    # in the hand-off: the verdict names the loop, and no param of the graph.
    loader = flowtrain.Loader(graph(batch=8, epochs=1), output="collate", prefetch=1)
    for _ in loader:
        time.sleep(0.15)
    verdict = loader.report()["verdict"]
    assert verdict.startswith("the graph waits for the Python loop to take its batches: 'python' "
                              "spent "), verdict
    assert verdict.endswith("of its time waiting for them; the graph is not what holds the run "
                            "back"), verdict


def test_each_rank_yields_len_batches_every_epoch(graph, monkeypatch):
    config = graph(batch=3)
    for rank in range(5):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "5")
        loader = flowtrain.Loader(config, output="collate")
        assert len(loader) == 3  # 36 photos padded to 8 a rank
        for _ in range(2):
            assert [len(i) for i, _ in epoch_of(loader)] == [3, 3, 2]


def test_a_progress_bar_counts_the_epochs_batches(graph, capsys):
    loader = flowtrain.Loader(graph(batch=8), output="collate", progress=True)
    assert len(epoch_of(loader)) == 5
    err = capsys.readouterr().err
    assert "epoch 0" in err and "5/5" in err, err


def test_epochs_are_the_stream_of_flowtrain_run_with_rollover(graph):
    loader = flowtrain.Loader(graph(batch=8), output="collate", rollover=True)
    assert len(loader) == 5  # ceil(36 / 8)
    first = epoch_of(loader)
    second = epoch_of(loader)  # the next `for` is the next epoch
    # One stream, as `flowtrain run` batches it: the batch of samples 32-39 ends in epoch 1.
    assert [len(i) for i, _ in first] == [8] * 4 and [len(i) for i, _ in second] == [8] * 5
    indices = torch.cat([i for i, _ in first + second])
    assert sorted(indices[:36].tolist()) == sorted(indices[36:].tolist()) == list(range(36))
    assert indices[:36].tolist() != indices[36:].tolist()  # epoch 1 has its own order
    loader.set_epoch(1)  # the epoch it is in: nothing changes
    assert len(epoch_of(loader)) == 4
    loader.set_epoch(0)  # another epoch: from its first sample
    again = epoch_of(loader)
    for (i0, x0), (i1, x1) in zip(first, again):
        assert torch.equal(i0, i1) and torch.equal(x0, x1)


def test_the_last_epoch_ends_with_the_stream_and_there_is_no_epoch_after_it(graph):
    loader = flowtrain.Loader(graph(batch=8, epochs=2), output="collate", rollover=True)
    got = epoch_of(loader) + epoch_of(loader)
    assert [len(i) for i, _ in got] == [8] * 9  # all 72 samples, as `flowtrain run` has them
    with pytest.raises(flowtrain.Error, match=r"epoch 2 is past the 2 epoch\(s\) of source 'files' "
                                              r"\(.*graph.yaml:\d+\): raise its epochs"):
        next(iter(loader))
    with pytest.raises(flowtrain.Error, match="epoch 5 is past"):
        loader.set_epoch(5)


def test_a_shard_the_batch_divides_gives_whole_epochs(graph):
    loader = flowtrain.Loader(graph(batch=6), output="collate")
    for epoch in range(2):
        loader.set_epoch(epoch)
        got = epoch_of(loader)
        assert len(got) == len(loader) == 6
        assert sorted(torch.cat([i for i, _ in got]).tolist()) == list(range(36))


@pytest.mark.parametrize("rollover", [False, True])
def test_state_dict_resumes_at_the_exact_next_batch(graph, rollover):
    config = graph(batch=8)
    loader = flowtrain.Loader(config, output="collate", rollover=rollover)
    epoch_of(loader)  # epoch 0
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = loader.state_dict()
    rest = [(b["index"].clone(), b["images"].clone()) for b in it] + epoch_of(loader)[:2]
    assert state["epoch"] == 1

    resumed = flowtrain.Loader(config, output="collate", rollover=rollover)
    resumed.load_state_dict(state)
    got = epoch_of(resumed) + epoch_of(resumed)[:2]
    assert len(got) == len(rest) == 5
    for (i0, x0), (i1, x1) in zip(rest, got):
        assert torch.equal(i0, i1) and torch.equal(x0, x1)

    with pytest.raises(flowtrain.Error, match="not in epoch 3"):
        resumed.load_state_dict({"flowtrain_loader": 1, "epoch": 3, "position": 5})


def test_garbage_states_are_refused_and_the_loader_is_unchanged(graph):
    loader = flowtrain.Loader(graph(batch=8), output="collate")
    first = epoch_of(loader)
    loader.set_epoch(0)
    good = {"flowtrain_loader": 1, "epoch": 0, "position": 0}
    for bad in [None, [], "state", {}, {"flowtrain_loader": 1}, dict(good, epoch=-1),
                dict(good, position=-8), dict(good, position=2.5), dict(good, epoch=True),
                dict(good, epoch="0"), dict(good, position=None), dict(good, flowtrain_loader=2),
                dict(good, extra=1), dict(good, epoch=2**40), dict(good, position=2**70)]:
        with pytest.raises(flowtrain.Error, match="Loader.load_state_dict: "):
            loader.load_state_dict(bad)
    again = epoch_of(loader)
    assert len(again) == len(first)
    for (i0, x0), (i1, x1) in zip(first, again):
        assert torch.equal(i0, i1) and torch.equal(x0, x1)


def test_a_closed_loader_gives_no_batch(graph):
    loader = flowtrain.Loader(graph(batch=8), output="collate")
    it = iter(loader)
    next(it)
    loader.close()
    with pytest.raises(flowtrain.Error, match="Loader: closed"):
        next(it)
    with flowtrain.Loader(graph(batch=8), output="collate") as other:
        next(iter(other))
    with pytest.raises(flowtrain.Error, match="Loader: closed"):
        next(iter(other))


def test_a_state_behind_a_mix_resumes_the_mixed_stream(graph, images, tmp_path):
    # Two sources mixed 3:1 are one stream: its state counts the mix's items, and loads again
    # (it divided by zero: a stream has no epoch length).
    config = tmp_path / "mix.yaml"
    config.write_text(textwrap.dedent(f"""\
        threads: 2
        stages:
          - {{type: image_folder, name: a, params: {{root: {images}, seed: 3, epochs: 2}}}}
          - {{type: image_folder, name: b, params: {{root: {images}, seed: 4, epochs: 1}}}}
          - {{type: mix, name: data, inputs: [a, b], params: {{weights: [3, 1], seed: 1}}}}
          - {{type: jpeg_decode, concurrency: 2}}
          - {{type: augment, params: {{size: 32, mode: eval, eval_crop: 1.0}}}}
          - {{type: collate, params: {{batch_size: 8, pool_size: 3}}}}
          - {{type: discard}}
        """))
    whole = epoch_of(flowtrain.Loader(str(config)))
    assert sum(len(i) for i, _ in whole) == 108
    loader = flowtrain.Loader(str(config))
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    assert state == {"flowtrain_loader": 1, "epoch": 0, "position": 40}
    loader.close()
    resumed = flowtrain.Loader(str(config))
    resumed.load_state_dict(state)
    rest = epoch_of(resumed)
    assert len(rest) == len(whole) - 5
    for (i0, x0), (i1, x1) in zip(whole[5:], rest):
        assert torch.equal(i0, i1) and torch.equal(x0, x1)


def test_a_break_leaves_the_loader_after_the_last_batch(graph):
    loader = flowtrain.Loader(graph(batch=6), output="collate")
    whole = [i for i, _ in epoch_of(loader)]
    loader.set_epoch(0)
    for n, batch in enumerate(loader):
        if n == 1:
            break
    rest = [b["index"].clone() for b in loader]
    assert len(rest) == 4 and all(torch.equal(a, b) for a, b in zip(whole[2:], rest))


def test_each_rank_reads_its_own_shard(graph, monkeypatch):
    config = graph(batch=6)
    seen = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = flowtrain.Loader(config, output="collate")
        assert len(loader) == 3  # 18 photos a rank
        seen.append(torch.cat([b["index"] for b in loader]).tolist())
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(36))


def test_only_batches_leave_a_loader(graph):
    with pytest.raises(flowtrain.Error, match="stage 'decode' .* emits .*Sample; a Loader yields batches"):
        flowtrain.Loader(graph(), output="decode")
    with pytest.raises(flowtrain.Error, match="has no stage 'colate'"):
        flowtrain.Loader(graph(), output="colate")
    with pytest.raises(flowtrain.Error, match=r"override 'stages.collate.params.batch_size=0': .*must be >= 1"):
        flowtrain.Loader(graph(), overrides=["stages.collate.params.batch_size=0"])


def live_threads():
    return len(os.listdir("/proc/self/task"))


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_a_loader_dropped_mid_epoch_stops_without_hang_or_leak(graph):
    config = graph(batch=12, pool=3, size=160)  # 12 x 3 x 160 x 160 floats: 3.7 MB a buffer

    def one():
        loader = flowtrain.Loader(config, output="collate", prefetch=2)
        batch = next(iter(loader))
        assert batch["images"].shape[0] == 12
        del loader, batch  # the graph is running, its queue and pool full
        gc.collect()

    one()
    one()
    threads, rss = live_threads(), rss_mb()
    for _ in range(12):
        one()
    # A thread left behind per loader would be 12 more; TBB may keep its 2 workers about.
    assert live_threads() - threads <= 2
    # A pool left behind each time would be 11 MB a loader.
    assert rss_mb() - rss < 40, f"{rss_mb() - rss:.0f} MB more after 12 loaders"


def interrupted(tmp_path, after_s, body, slow="time.sleep(0.2)"):
    """Runs `body` in a python3 of its own with a `slow` batch stage registered (its body: `slow`,
    0.2 s a batch), sends that process SIGINT after `after_s` seconds, and returns what it
    printed."""
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent("""
        import os, signal, threading, time
        import flowtrain

        @flowtrain.stage("slow")
        def slow(batch):
            {slow}
            return batch

        threading.Timer({after_s}, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    """).format(after_s=after_s, slow=slow) + textwrap.dedent(body))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out


# KeyboardInterrupt comes at once, also while a Python stage is inside a long call (not when
# the call returns); a stage running Python lines is interrupted too, so close() is quick.
@pytest.mark.parametrize("slow, closes_within_s", [
    ("time.sleep(0.2)", 5),                       # 0.2 s a batch
    ("for _ in range(150): time.sleep(0.1)", 5),  # 15 s of Python lines
    ("time.sleep(8)", 12),                        # one C call: close() waits for its end
])
def test_ctrl_c_raises_keyboard_interrupt_at_once_and_stops_the_graph(graph, tmp_path, slow,
                                                                      closes_within_s):
    config = graph(batch=4, extra_batch="  - {type: slow, concurrency: 1}\n")
    out = interrupted(tmp_path, 0.5, f"""
        loader = flowtrain.Loader({config!r}, output="slow")
        start = time.monotonic()
        try:
            for batch in loader:
                pass
        except KeyboardInterrupt:
            print(f"interrupted {{time.monotonic() - start:.2f}}")
        loader.close()
        print(f"closed {{time.monotonic() - start:.2f}}")
    """, slow=slow)
    times = dict(line.split() for line in out.stdout.splitlines())
    assert "interrupted" in times and float(times["interrupted"]) < 4, out.stdout + out.stderr
    assert float(times["closed"]) < closes_within_s, out.stdout + out.stderr


def test_ctrl_c_stops_flowtrain_run_at_the_next_item(graph, tmp_path):
    config = graph(batch=4, extra_batch="  - {type: slow}\n")
    out = interrupted(tmp_path, 0.8, f"""
        try:
            flowtrain.run({config!r}, ["stages.files.params.epochs=50"])
            print("ran to the end")
        except KeyboardInterrupt as stop:
            print("interrupted:", stop)
    """)
    assert "interrupted: SIGINT during" in out.stdout, out.stdout + out.stderr
