"""A fit resumed from a mid-epoch ``last.ckpt`` goes on with the epoch's next batch: the training loader's
position (data_modules.captions.ResumableLoader) and the fit record's partial segment."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch
from torch.utils.data import Dataset

from data_modules.captions import CaptionRoundsSampler, EpochSampler, ResumableLoader
from grounding.lightning import FIT_RECORD, FitRecord


class _Counted(Dataset):
    """Items 0..n-1; remembers which were loaded."""

    def __init__(self, n: int):
        self.n, self.loaded = n, []

    def __len__(self):
        return self.n

    def __getitem__(self, item):
        self.loaded.append(item)
        return torch.tensor(item if isinstance(item, int) else item[0])


def _loader(sampler, n=23, batch_size=4, **kwargs):
    data = _Counted(n)
    return ResumableLoader(data, batch_size=batch_size, sampler=sampler, **kwargs), data


def _epoch(loader, epoch, stop=None):
    loader.sampler.set_epoch(epoch)  # as Lightning does at every epoch start
    out = []
    for i, batch in enumerate(loader):
        out.append(batch.tolist())
        if stop is not None and i + 1 == stop:
            break
    return out


def test_resumed_epoch_goes_on_with_the_same_order_and_never_loads_the_skipped_items():
    straight, _ = _loader(EpochSampler(23, seed=3))
    whole = _epoch(straight, 2)
    first, _ = _loader(EpochSampler(23, seed=3))
    head = _epoch(first, 2, stop=3)
    state = first.state_dict()
    assert state == {"epoch": 2, "batches": 3}

    resumed, data = _loader(EpochSampler(23, seed=3))  # a new process: a fresh loader and sampler
    resumed.load_state_dict(state)
    tail = _epoch(resumed, 2)
    assert head + tail == whole and len(whole) == 6
    assert sorted(data.loaded) == sorted(x for batch in tail for x in batch)  # the first 12 items never loaded
    assert resumed.state_dict() == {"epoch": 2, "batches": 6}
    assert _epoch(resumed, 3) == _epoch(_loader(EpochSampler(23, seed=3))[0], 3)  # the next epoch: all of it


def test_a_state_from_an_epochs_end_skips_nothing_in_the_next_epoch():
    loader, _ = _loader(EpochSampler(23, seed=0))
    _epoch(loader, 0)
    resumed, _ = _loader(EpochSampler(23, seed=0))
    resumed.load_state_dict(loader.state_dict())  # {"epoch": 0, "batches": 6}
    assert _epoch(resumed, 1) == _epoch(_loader(EpochSampler(23, seed=0))[0], 1)


def test_resume_with_workers_and_caption_rounds():
    """With loader workers the sampler is drawn when the pass starts, so the position (and the epoch Lightning
    sets) apply there too; COMPOSER's every-caption sampler yields (image, choice) items."""
    counts = torch.tensor([3, 1, 2, 5, 4]).numpy()
    make = lambda: CaptionRoundsSampler(counts, keep=range(5), seed=1)  # noqa: E731
    kwargs = dict(n=5, batch_size=2, num_workers=2)
    whole = _epoch(_loader(make(), **kwargs)[0], 1)
    first = _loader(make(), **kwargs)[0]
    head = _epoch(first, 1, stop=2)
    resumed = _loader(make(), **kwargs)[0]
    resumed.load_state_dict(first.state_dict())
    assert head + _epoch(resumed, 1) == whole and len(whole) == 8


def test_fit_record_counts_a_mid_epoch_save_and_its_resume(tmp_path):
    """The record written at a mid-epoch save counts the finished epochs and the steps; a resume from that
    checkpoint keeps the segment whole, and its epoch is counted once, when it ends."""
    def trainer(epoch, step, ckpt=None):
        return SimpleNamespace(default_root_dir=str(tmp_path), ckpt_path=ckpt, current_epoch=epoch, global_step=step,
                               is_global_zero=True, fast_dev_run=False, sanity_checking=False, num_devices=1)

    read = lambda: json.loads((tmp_path / FIT_RECORD).read_text())  # noqa: E731
    rec = FitRecord()
    rec.on_fit_start(trainer(0, 0), None)
    rec.on_train_start(trainer(0, 0), None)
    rec.update(trainer(0, 3), epochs_done=0)  # a save 3 steps into the first epoch
    rec.write(trainer(0, 3))
    assert read()["epochs"] == 0 and read()["steps"] == 3  # written: a killed fit resumes from it
    rec.on_train_epoch_end(trainer(0, 10), None)
    rec.started -= 140.0  # 140 s of training by then: the cut below keeps 5/14 of them
    rec.update(trainer(1, 14), epochs_done=1)  # 4 steps into epoch 1, then killed
    rec.write(trainer(1, 14))
    assert read()["epochs"] == 1

    again = FitRecord()
    again.on_fit_start(trainer(1, 14, "last.ckpt"), None)
    again.on_train_start(trainer(1, 14, "last.ckpt"), None)
    again.on_train_epoch_end(trainer(1, 20, "last.ckpt"), None)
    done = read()
    assert done["epochs"] == 2 and done["steps"] == 20
    assert [(s["first_epoch"], s["first_step"], s["epochs"]) for s in done["segments"]] == [(0, 0, 1), (1, 14, 1)]

    # resumed from an earlier checkpoint (step 5, epoch 0): the first segment is cut there, in proportion
    earlier = FitRecord()
    earlier.on_fit_start(trainer(0, 5, "mid.ckpt"), None)
    earlier.on_train_start(trainer(0, 5, "mid.ckpt"), None)
    first = earlier.segments[0]
    assert (first["epochs"], first["steps"]) == (0, 5) and "last_epoch" not in first
    assert first["seconds"] == round(done["segments"][0]["seconds"] * 5 / 14, 1)
    assert len(earlier.segments) == 2  # the cut one and the new one; the segment from step 14 dropped


def test_mid_epoch_saves_follow_the_clock_and_read_it_every_16th_batch_under_ddp(tmp_path, monkeypatch):
    """One process: the clock at every batch, a save once the interval has passed (never at the epoch's last batch).
    Several: rank 0's clock through a broadcast (a collective), read at every 16th batch only."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from grounding.lightning import LastCheckpoint

    # Lightning's own per-batch checks (step and time intervals, both off here) need a real Trainer
    monkeypatch.setattr(ModelCheckpoint, "on_train_batch_end", lambda *args: None)

    def run(world_size, every_minutes, batches=40):
        record = FitRecord()
        saves, broadcasts = [], []
        last = LastCheckpoint(record, every_minutes=every_minutes, dirpath=tmp_path, monitor=None, save_top_k=1,
                              filename="last", enable_version_counter=False, save_on_train_epoch_end=True)
        monkeypatch.setattr(last, "_save_checkpoint", lambda trainer, path: saves.append((trainer.batch, path)))
        monkeypatch.setattr(record, "update", lambda trainer, epochs_done: None)
        monkeypatch.setattr(record, "write", lambda trainer: None)
        strategy = SimpleNamespace(broadcast=lambda due: broadcasts.append(due) or due)
        for batch in range(batches):
            trainer = SimpleNamespace(sanity_checking=False, fast_dev_run=False, world_size=world_size, batch=batch,
                                      strategy=strategy, num_training_batches=batches, current_epoch=0, global_step=batch)
            last.saved_at -= 3600  # an hour passes at every batch
            LastCheckpoint.on_train_batch_end(last, trainer, None, None, None, batch)
        return saves, broadcasts

    saves, broadcasts = run(1, 15)
    assert [b for b, _ in saves] == list(range(39)) and saves[0][1] == str(tmp_path / "last.ckpt")  # not batch 39
    assert len(broadcasts) == 40
    saves, broadcasts = run(2, 15)
    assert [b for b, _ in saves] == [15, 31] and len(broadcasts) == 2
    assert run(1, 0) == ([], [])  # 0: epoch ends only
