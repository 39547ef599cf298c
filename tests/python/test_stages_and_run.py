"""Stages written in Python, in a YAML graph; flowtrain.run and flowtrain.stages."""

import pytest
import torch

import flowtrain


@flowtrain.stage("negate", item="batch")
def negate(batch):
    """Negates the images."""
    batch["images"] = -batch["images"]
    return batch


@flowtrain.stage("invert", item="sample")
def invert(sample):
    sample["image"] = 255 - sample["image"]
    return sample


@flowtrain.stage("drop_class_1", item="sample")
def drop_class_1(sample):
    return None if sample["label"] == 1 else sample


@flowtrain.stage("boom", item="batch")
def boom(batch):
    raise ValueError("bad pixel\nsecond line")


def batches(config, output):
    return [(b["index"].clone(), b["images"].clone()) for b in flowtrain.Loader(config, output=output)]


def test_a_batch_stage_changes_what_the_loader_yields(graph):
    plain = batches(graph(), "collate")
    negated = batches(graph(extra_batch="  - {type: negate, concurrency: 2}\n", name="n.yaml"), "negate")
    assert len(plain) == len(negated)
    for (i0, x0), (i1, x1) in zip(plain, negated):
        assert torch.equal(i0, i1) and torch.equal(-x0, x1)


def test_a_sample_stage_sees_decoded_pixels(graph):
    # Inverting before a flip-free resize is exactly 1 - x in [0, 1] before normalisation:
    # compare through the normaliser's affine map instead of pixel-exact interpolation.
    config = graph(extra_sample="  - {type: invert, concurrency: 2}\n", name="i.yaml")
    loader = flowtrain.Loader(config, output="collate")
    plain = flowtrain.Loader(graph(), output="collate")
    for a, b in zip(plain, loader):
        assert torch.equal(a["index"], b["index"])
        mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
        std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
        pa, pb = a["images"] * std + mean, b["images"] * std + mean
        assert torch.allclose(pa + pb, torch.ones_like(pa), atol=2.5 / 255)


def test_a_dropped_sample_is_counted_in_the_report(graph):
    config = graph(extra_sample="  - {type: drop_class_1}\n", name="d.yaml")
    loader = flowtrain.Loader(config, output="collate")
    labels = torch.cat([b["labels"] for b in loader])
    assert labels.numel() == 24 and 1 not in labels.tolist()
    # The epoch's graph ended with the epoch: its report is there (with rollover, the graph
    # runs on until the loader is closed).
    stages = {s["name"]: s for s in loader.report()["stages"]}
    assert stages["drop_class_1"]["dropped"] == 12
    stream = flowtrain.Loader(config, output="collate", rollover=True)
    assert len([b for b in stream]) > 0 and stream.report() is None
    stream.close()
    stages = {s["name"]: s for s in stream.report()["stages"]}
    assert stages["drop_class_1"]["dropped"] >= 12  # and what it did ahead of the loop
    assert "python" in stages  # the loader's end of the graph is a node like any other


def test_an_error_in_a_python_stage_reaches_the_caller_as_one_line(graph):
    loader = flowtrain.Loader(graph(extra_batch="  - {type: boom}\n", name="b.yaml"), output="boom")
    with pytest.raises(flowtrain.Error) as error:
        list(loader)
    message = str(error.value)
    assert "\n" not in message
    assert "stage 'boom'" in message and "ValueError: bad pixel second line" in message
    assert "test_stages_and_run.py:" in message


@flowtrain.stage("shrink", item="batch")
def shrink(batch):
    batch["images"] = batch["images"][:, :, :16, :16]
    return batch


@flowtrain.stage("grad", item="batch")
def grad(batch):
    batch["images"] = batch["images"].clone().requires_grad_()
    return batch


@flowtrain.stage("forget", item="batch")
def forget(batch):
    return {"images": batch["images"]}


@flowtrain.stage("forget_label", item="sample")
def forget_label(sample):
    del sample["label"]
    return sample


@pytest.mark.parametrize("stage, item, problem", [
    ("shrink", "batch", "returned 'images' as [8, 3, 16, 16], expected [8, 3, 32, 32]"),
    ("grad", "batch", "returned 'images' as a tensor that requires grad"),
    ("forget", "batch", "returned a dict without 'labels'"),
    ("forget_label", "sample", "returned a dict without 'label'"),
])
def test_what_a_python_stage_returns_is_checked_in_one_line(graph, stage, item, problem):
    entry = "  - {type: " + stage + "}\n"
    config = graph(**{"extra_" + item: entry}, name=stage + ".yaml")
    with pytest.raises(flowtrain.Error) as error:
        for _ in flowtrain.Loader(config, output="collate" if item == "sample" else stage):
            pass
    message = str(error.value)
    assert "\n" not in message and f"python stage '{stage}' " + problem in message


def test_a_stage_keeps_its_item_type_and_builtin_names_are_taken():
    with pytest.raises(flowtrain.Error, match="registered for batches"):
        flowtrain.stage("negate", item="sample")(lambda s: s)
    with pytest.raises(flowtrain.Error, match="already a stage of flowtrain"):
        flowtrain.stage("collate")(lambda b: b)


def test_run_returns_the_report_and_stages_lists_the_registry(graph):
    config = graph(extra_batch="  - {type: negate}\n", name="r.yaml")
    report = flowtrain.run(config, ["stages.files.params.epochs=2"])
    assert report["stopped"] is None and len(report["phases"]) == 1
    stages = {s["name"]: s for s in report["phases"][0]["stages"]}
    # 72 samples in one stream of 2 epochs: 9 full batches.
    assert stages["negate"]["items_in"] == 9 and stages["sink"]["items_in"] == 9
    assert report["phases"][0]["verdict"]
    by_type = {s["type"]: s for s in flowtrain.stages()}
    assert by_type["negate"]["summary"] == "Negates the images."
    assert "batch_size" in [p["name"] for p in by_type["collate"]["params"]]
