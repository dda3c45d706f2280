"""The cache of GGUF files converted to Hugging Face directories: one per file, and the
conversions of files that are gone removed at the next conversion."""

import os

from lmiserve import model_store


def _fake_convert(gguf, out):
    (out / "config.json").write_text("{}")


def _gguf(root, where, name="m.gguf"):
    path = root / where / name
    path.parent.mkdir(parents=True)
    path.write_bytes(where.encode())
    return path


def test_a_conversion_whose_source_is_gone_is_removed_by_the_next(tmp_path, monkeypatch):
    monkeypatch.setenv("LMISERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_store, "_convert", _fake_convert)
    first, second = _gguf(tmp_path, "a"), _gguf(tmp_path, "b")
    other = _gguf(tmp_path, "x", "other.gguf")
    kept = [model_store.gguf_to_hf(first), model_store.gguf_to_hf(second), model_store.gguf_to_hf(other)]
    assert len(set(kept)) == 3 and all(
        (d / model_store.GGUF_SOURCE).resolve() == g for d, g in zip(kept, (first, second, other))
    )
    unlinked = kept[0].parent / f"m-{'0' * 12}"
    unlinked.mkdir()
    assert model_store.gguf_to_hf(first) == kept[0]  # converted already: nothing removed
    first.unlink()
    other.unlink()
    third = model_store.gguf_to_hf(_gguf(tmp_path, "c"))
    left = sorted(os.listdir(third.parent))
    assert not kept[0].exists() and kept[1].exists() and third.exists()
    assert kept[2].exists() and unlinked.exists()  # another file's, and one without a link: left
    assert [n for n in left if not n.endswith(".lock")] == sorted(p.name for p in (kept[1], kept[2], third, unlinked))
