"""Synthetic data and the chunked tiny MLLM (in process, no msrun)."""
import numpy as np
import pytest

from hyperparallel.data import DataConfig, make_micro_batch

CFG = DataConfig(micro_batch_size=4, images_per_sample=[0.3, 0.3, 0.2, 0.2], video_prob=0.15, video_frames=5)


def test_micro_batch_is_a_pure_function_of_seed_step_micro():
    a, b = make_micro_batch(CFG, 3, 5, 2), make_micro_batch(CFG, 3, 5, 2)
    for f in ("patches", "text_ids", "merge_index", "onehot", "mask"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    c = make_micro_batch(CFG, 3, 5, 3)
    assert not np.array_equal(a.text_ids, c.text_ids)


def test_encoder_work_varies_and_is_not_padded():
    mbs = [make_micro_batch(CFG, 0, s, m) for s in range(10) for m in range(4)]
    counts = [mb.num_images for mb in mbs]
    assert len(set(counts)) >= 4, counts               # real variation of encoder work
    assert min(counts) >= 1                            # >= 1 image so messages are never empty
    for mb in mbs:
        assert mb.num_images == sum(mb.images_per_sample)   # only real images reach the encoder
        assert mb.patches.shape[1:] == (CFG.num_patches, CFG.patch_dim)
    assert any(CFG.video_frames in mb.images_per_sample for mb in mbs)  # video-like samples occur
    assert any(0 in mb.images_per_sample for mb in mbs)


def test_merge_index_places_images_then_text():
    mb = make_micro_batch(CFG, 1, 0, 0)
    S, T, n = CFG.seq_len, CFG.text_len, mb.num_images
    idx = mb.merge_index.reshape(-1, S)
    off = 0
    for b, k in enumerate(mb.images_per_sample):
        np.testing.assert_array_equal(idx[b, :k], 1 + off + np.arange(k))
        np.testing.assert_array_equal(idx[b, k:k + T], 1 + n + b * T + np.arange(T))
        assert (idx[b, k + T:] == 0).all()
        assert mb.mask[b].sum() == T - 1
        off += k


def test_text_needs_the_images():
    """The token stride is the image-class sum: same start token, different images, different text."""
    strides = set()
    for m in range(40):
        mb = make_micro_batch(CFG, 0, 0, m)
        t = mb.text_ids.reshape(-1, CFG.text_len)
        strides |= {int((r[1] - r[0]) % CFG.vocab) for r in t}
    assert len(strides) >= 3


def test_bad_data_section_names_the_field():
    with pytest.raises(ValueError, match=r"^data.images_per_sample"):
        DataConfig.from_section({"images_per_sample": [0.5, 0.1]})
    with pytest.raises(ValueError, match=r"^data.nope"):
        DataConfig.from_section({"nope": 1})


def test_any_cut_of_the_model_equals_the_whole():
    pytest.importorskip("mindspore", reason="mindspore is not installed")
    from hyperparallel.runtime import compat
    from hyperparallel.runconfig import RunConfig
    from hyperparallel.models.cells import MicroTensors
    compat.setup_device("CPU")
    raw = {"model": {"vision_layers": 2, "llm_layers": 4}, "train": {"seed": 7}}
    rc = RunConfig.from_raw(raw)
    m = rc.model
    vision, llm = m.build_full()
    cut = [m.build_chunk("vision", 0, 1), m.build_chunk("vision", 1, 2),
           m.build_chunk("llm", 0, 1), m.build_chunk("llm", 1, 3), m.build_chunk("llm", 3, 4)]
    whole = {p.name: p.asnumpy() for c in (vision, llm) for p in c.get_parameters()}
    parts = {p.name: p.asnumpy() for c in cut for p in c.get_parameters()}
    assert whole.keys() == parts.keys()
    for k in whole:
        np.testing.assert_array_equal(whole[k], parts[k])
    mt = MicroTensors(make_micro_batch(rc.data, 7, 0, 0), 0.5)
    want = llm.forward(vision.forward(mt.patches, mt), mt).asnumpy()
    x = mt.patches
    for c in cut:
        x = c.forward(x, mt)
    np.testing.assert_allclose(x.asnumpy(), want, rtol=1e-6)
    assert np.isfinite(want) and want > 0
