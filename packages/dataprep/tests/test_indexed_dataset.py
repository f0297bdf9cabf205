"""The MMIDIDX .bin/.idx format: exact bytes, validation of damaged files, writer and merge."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest

from bloomline.common import UserError
from bloomline.dataprep import (
    CorruptTokenFileError,
    IndexedDataset,
    IndexedDatasetWriter,
    merge_indexed_datasets,
    token_dtype_for_vocab,
)

# Three documents: [1, 2, 3], an empty one, [4, 5]; uint16 tokens. Worked out by hand from
# docs/formats/megatron-data.md: S = 2 sequences (the empty document owns none), D' = 4
# boundaries [0, 1, 1, 2], byte offsets [0, 6] (3 tokens * 2 bytes).
GOLDEN_IDX = bytes.fromhex(
    "4d4d4944494458 0000"          # magic "MMIDIDX\0\0"
    "0100000000000000"            # version 1
    "08"                          # dtype code 8 = uint16
    "0200000000000000"            # S = 2 sequences
    "0400000000000000"            # D' = 4 document boundaries
    "03000000 02000000"           # lengths int32[2]
    "0000000000000000 0600000000000000"  # byte offsets int64[2]
    "0000000000000000 0100000000000000 0100000000000000 0200000000000000"  # boundaries
)
GOLDEN_BIN = bytes.fromhex("0100 0200 0300 0400 0500")


def _write_golden(prefix):
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        writer.add_document(np.array([1, 2, 3]))
        writer.add_document(np.array([], dtype=np.int64))
        writer.add_document(np.array([4, 5]))


def test_writer_produces_hand_computed_golden_bytes(tmp_path):
    """Catches: any drift from Megatron's byte layout (header, order of arrays, empty docs)."""
    _write_golden(tmp_path / "g")
    assert (tmp_path / "g.idx").read_bytes() == GOLDEN_IDX
    assert (tmp_path / "g.bin").read_bytes() == GOLDEN_BIN
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.bin", "g.idx"]  # no temporaries


def test_reader_round_trip_and_zero_copy(tmp_path):
    """Catches: wrong offsets/dtype in the reader, or ds[i] copying instead of viewing."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 70000, size=rng.integers(0, 50)) for _ in range(300)]
    with IndexedDatasetWriter(tmp_path / "r", np.int32) as writer:
        for doc in docs:
            writer.add_document(doc)
    ds = IndexedDataset(tmp_path / "r")
    nonempty = [d for d in docs if len(d)]
    assert len(ds) == len(nonempty) and ds.num_documents == len(docs)
    assert ds.dtype == np.int32
    for i, doc in enumerate(nonempty):
        np.testing.assert_array_equal(ds[i], doc)
    assert np.shares_memory(ds[3], ds._bin) and not ds[3].flags.writeable
    np.testing.assert_array_equal(ds.get(1, offset=1, length=2), nonempty[1][1:3])
    np.testing.assert_array_equal(ds[-1], nonempty[-1])
    np.testing.assert_array_equal(ds.sequence_lengths, [len(d) for d in nonempty])
    ds.verify()
    clone = pickle.loads(pickle.dumps(ds))  # DataLoader workers receive it pickled
    np.testing.assert_array_equal(clone[5], ds[5])
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_documents_with_several_sequences(tmp_path):
    """Catches: document boundaries counted in documents instead of sequences."""
    with IndexedDatasetWriter(tmp_path / "s", np.uint16) as writer:
        writer.add_document(np.arange(6), sequence_lengths=[2, 4])
        writer.add_document(np.arange(3))
    ds = IndexedDataset(tmp_path / "s")
    np.testing.assert_array_equal(ds.document_indices, [0, 2, 3])
    np.testing.assert_array_equal(ds[1], [2, 3, 4, 5])


def test_token_dtype_threshold_matches_megatron():
    """Catches: switching to int32 at 65536 instead of Megatron's 65500."""
    assert token_dtype_for_vocab(65499) == np.uint16
    assert token_dtype_for_vocab(65500) == np.int32


def test_writer_rejects_ids_that_do_not_fit_and_leaves_nothing(tmp_path):
    """Catches: ids >= 65536 silently wrapping in a uint16 file; litter after an error."""
    with pytest.raises(ValueError, match="outside the range"), IndexedDatasetWriter(
            tmp_path / "w", np.uint16) as writer:
        writer.add_document(np.array([70000]))
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_existing_output(tmp_path):
    """Catches: clobbering existing token files without --overwrite."""
    _write_golden(tmp_path / "g")
    with pytest.raises(UserError, match="output exists"):
        IndexedDatasetWriter(tmp_path / "g", np.uint16)


def _damage(tmp_path, edit_idx=None, edit_bin=None):
    _write_golden(tmp_path / "d")
    if edit_idx:
        (tmp_path / "d.idx").write_bytes(edit_idx(bytearray(GOLDEN_IDX)))
    if edit_bin:
        (tmp_path / "d.bin").write_bytes(edit_bin(bytearray(GOLDEN_BIN)))
    return tmp_path / "d"


def _set(offset, data):
    def edit(buf):
        buf[offset : offset + len(data)] = data
        return bytes(buf)
    return edit


@pytest.mark.parametrize(("edit_idx", "edit_bin", "reason"), [
    (lambda b: bytes(b[:-5]), None, "truncated"),
    (lambda b: bytes(b[:20]), None, "shorter than the header"),
    (lambda b: bytes(b) + b"\0", None, "trailing bytes"),
    (_set(0, b"XXIDIDX\0\0"), None, "bad magic"),
    (_set(9, struct.pack("<Q", 2)), None, "version 2"),
    (_set(17, b"\x09"), None, "unknown dtype code 9"),
    (_set(len(GOLDEN_IDX) - 8, struct.pack("<q", 3)), None, "last document boundary 3"),
    (_set(len(GOLDEN_IDX) - 32, struct.pack("<q", 1)), None, "must start at 0"),
    (None, lambda b: bytes(b[:-1]), "truncated: 9 bytes, the index needs 10"),
    (None, lambda b: bytes(b) + b"\0\0", "longer than its index says"),
])
def test_reader_refuses_damaged_files_with_reason(tmp_path, edit_idx, edit_bin, reason):
    """Catches: a damaged file read as garbage tokens instead of refused with its reason."""
    prefix = _damage(tmp_path, edit_idx, edit_bin)
    with pytest.raises(CorruptTokenFileError, match=reason) as info:
        IndexedDataset(prefix)
    assert "\n" not in str(info.value) and "d." in str(info.value)


def test_open_finds_inconsistent_offsets(tmp_path):
    """Catches: offsets that disagree with lengths (reads would return the wrong tokens)
    accepted on open because the .bin size still adds up (it was left to verify())."""
    # first byte offset 0 -> 2: sizes still add up, only the full check can see it
    prefix = _damage(tmp_path, _set(34 + 8, struct.pack("<q", 2)))
    with pytest.raises(CorruptTokenFileError, match="byte offset of sequence 0"):
        IndexedDataset(prefix)


# Offsets of GOLDEN_IDX: lengths at 34 (int32[2]), byte offsets at 42 (int64[2]), document
# boundaries at 58 (int64[4]); a bigger file for the cases that need more than 2 sequences.
def _many(tmp_path, count=300):
    rng = np.random.default_rng(3)
    with IndexedDatasetWriter(tmp_path / "m", np.uint16) as writer:
        for number in range(count):
            writer.add_document(rng.integers(0, 500, size=1 + number % 7))
            if number == 100:
                writer.add_document(np.zeros(0, np.int64))  # an empty document: 101
    return tmp_path / "m", count


def _poke(path, offset, fmt, value):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(struct.pack(fmt, value))


@pytest.mark.parametrize(("damage", "expected"), [
    # offset of sequence 200 made negative: the gather loop used it as a memcpy source
    (lambda n: (34 + 4 * n + 8 * 200, "<q", -8),
     "byte offset of sequence 200 (document 201) is -8, expected "),
    # offset past the end of the .bin (lengths and .bin size unchanged)
    (lambda n: (34 + 4 * n + 8 * 150, "<q", 1 << 40),
     "byte offset of sequence 150 (document 151) is 1099511627776"),
    # an offset that stays inside the file but skips tokens
    (lambda n: (34 + 4 * n + 8 * 7, "<q", 2),
     "byte offset of sequence 7 (document 7) is 2, expected "),
    (lambda n: (34 + 4 * 120, "<i", -3), "negative length -3 at sequence 120 (document 121)"),
    # boundary of document 50 above the next one's
    (lambda n: (34 + 12 * n + 8 * 50, "<q", 60), "document boundaries decrease at document 50"),
], ids=["negative offset", "offset past the .bin", "offset skipping tokens", "negative length",
        "decreasing boundaries"])
def test_open_refuses_index_pointing_outside_its_bin(tmp_path, damage, expected):
    """Catches: an .idx whose offsets are negative, run past the .bin or skip tokens, whose
    lengths are negative, or whose document boundaries go back, opened as valid: the trainer's
    compiled gather then read outside the mapped .bin (a segfault) or served garbage. Opening
    refuses each with one line naming the file and the first bad sequence/document."""
    prefix, count = _many(tmp_path)
    offset, fmt, value = damage(count)
    _poke(f"{prefix}.idx", offset, fmt, value)
    with pytest.raises(CorruptTokenFileError) as info:
        IndexedDataset(prefix)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{prefix}.idx: corrupted index: ")
    assert expected in message, message


@pytest.mark.parametrize(("code", "name"), [(6, "float64"), (7, "float32")])
def test_float_token_files_are_refused(tmp_path, code, name):
    """Catches: a .bin/.idx pair whose dtype code says float (Megatron's enum has float32 and
    float64 codes, used for other data) opened as token ids: float bits read as ids. The
    reader refuses it naming the file and the code; the writer refuses to write one."""
    values = np.arange(6, dtype=name)
    (tmp_path / "f.bin").write_bytes(values.tobytes())
    (tmp_path / "f.idx").write_bytes(
        GOLDEN_IDX[:17] + bytes([code]) + GOLDEN_IDX[18:34]
        + np.array([3, 3], np.int32).tobytes()
        + np.array([0, 3 * values.itemsize], np.int64).tobytes()
        + np.array([0, 1, 1, 2], np.int64).tobytes())
    with pytest.raises(CorruptTokenFileError) as info:
        IndexedDataset(tmp_path / "f")
    assert str(info.value) == (
        f"{tmp_path / 'f.idx'}: not a valid MMIDIDX index: dtype code {code} ({name}) is not "
        "an integer type; token ids must be integers (uint16 or int32 as written by dataprep "
        "and Megatron's preprocessing)")
    with pytest.raises(ValueError, match="not an integer MMIDIDX token dtype"):
        IndexedDatasetWriter(tmp_path / "w", np.float32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin", "f.idx"]


def test_every_integer_dtype_of_megatron_opens(tmp_path):
    """Catches: the dtype check refusing integer codes Megatron allows for tokens (uint8,
    int8, int16, int64 besides the uint16/int32 that are written by default)."""
    for dtype in (np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint16):
        with IndexedDatasetWriter(tmp_path / np.dtype(dtype).name, dtype) as writer:
            writer.add_document(np.array([1, 2, 3]))
        dataset = IndexedDataset(tmp_path / np.dtype(dtype).name)
        assert dataset.dtype == dtype and list(dataset[0]) == [1, 2, 3]


def test_missing_files_are_named(tmp_path):
    """Catches: a numpy/OS traceback instead of naming the missing file."""
    with pytest.raises(UserError, match=r"nope\.idx: no such file"):
        IndexedDataset(tmp_path / "nope")


def test_merge_concatenates_in_order(tmp_path):
    """Catches: shifted document boundaries or byte offsets after concatenation."""
    _write_golden(tmp_path / "a")
    with IndexedDatasetWriter(tmp_path / "b", np.uint16) as writer:
        writer.add_document(np.array([9, 9, 9, 9]))
    merged = merge_indexed_datasets([tmp_path / "a", tmp_path / "b", tmp_path / "a"],
                                    tmp_path / "m")
    merged.verify()
    assert merged.num_documents == 7
    np.testing.assert_array_equal(merged.document_indices, [0, 1, 1, 2, 3, 4, 4, 5])
    assert [list(merged[i]) for i in range(len(merged))] == [
        [1, 2, 3], [4, 5], [9, 9, 9, 9], [1, 2, 3], [4, 5]]


def test_merge_refuses_mixed_dtypes(tmp_path):
    """Catches: concatenating uint16 and int32 tokens into an unreadable file."""
    _write_golden(tmp_path / "a")
    with IndexedDatasetWriter(tmp_path / "b", np.int32) as writer:
        writer.add_document(np.array([1]))
    with pytest.raises(UserError, match="int32.*uint16"):
        merge_indexed_datasets([tmp_path / "a", tmp_path / "b"], tmp_path / "m")
    assert not (tmp_path / "m.idx").exists()
