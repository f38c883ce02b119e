"""Column helpers the readers share: dictionary columns, factorizing, key lookups, and `args` JSON
built column-wise (a Python loop over a million rows would cost seconds)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def floats(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numeric column as float64, NaN for nulls (missing figures stay visible to numpy's nan-aware reductions)."""
    return np.asarray(pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


def dict_array(codes: np.ndarray, values: list[Any]) -> pa.DictionaryArray:
    """A dictionary column from int codes into `values`; code -1 is null."""
    codes = np.asarray(codes, dtype=np.int32)
    mask = codes < 0
    indices = pa.array(codes, mask=mask if mask.any() else None)
    return pa.DictionaryArray.from_arrays(indices, pa.array([str(v) for v in values], pa.string()))


def encode_strings(values: Any) -> tuple[np.ndarray, list[str]]:
    """(int32 codes, -1 for null; the distinct strings) of a sequence of strings, hashed in Arrow."""
    encoded = pa.array(values if isinstance(values, (list, tuple)) else list(values), pa.string()).dictionary_encode()
    return encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32), encoded.dictionary.to_pylist()


def grouped(pairs: Any) -> dict[str, Any]:
    """A dict from (name, value) pairs; a name given more than once keeps all its values, as a list."""
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name not in out:
            out[name] = value
        elif isinstance(out[name], list):
            out[name].append(value)
        else:
            out[name] = [out[name], value]
    return out


def factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int32 codes, distinct values in order of appearance), hashed rather than sorted."""
    encoded = pa.array(values).dictionary_encode()
    return encoded.indices.to_numpy().astype(np.int32), encoded.dictionary.to_numpy()


def group_codes(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int32 code per row, first row of each code) of the distinct combinations of the columns' values,
    in order of appearance: a multi-column `factorize`."""
    codes = np.zeros(len(columns[0]) if columns else 0, dtype=np.int64)
    for column in columns:
        column_codes, values = factorize(column)
        codes, _ = factorize(codes * len(values) + column_codes)
        codes = codes.astype(np.int64)
    _, first = np.unique(codes, return_index=True)
    return codes.astype(np.int32), first


def raw_strings(values: Any) -> tuple[pa.Array, np.ndarray, int]:
    """An Arrow string array of raw JSON byte strings (empty → null), the mask of present ones, and how
    many held bytes that are not UTF-8 (inside a JSON string: a decoder keeping raw JSON does not check
    them), which are decoded with U+FFFD. Built from one joined buffer rather than a Python string per value."""
    n = len(values)
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
    present = lengths > 0
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    large = offsets[-1] >= 2**31
    validity = None if present.all() else pa.py_buffer(np.packbits(present, bitorder="little"))
    array = pa.Array.from_buffers(
        pa.large_string() if large else pa.string(), n,
        [validity, pa.py_buffer(offsets if large else offsets.astype(np.int32)),
         pa.py_buffer(b"".join(values))],
        null_count=int(n - present.sum()),
    )
    try:
        array.validate(full=True)
    except pa.ArrowInvalid:
        texts = [_utf8(v) for v in values]
        replaced = sum(1 for text in texts if isinstance(text, _Replaced))
        return pa.array(texts, array.type), present, replaced
    return array, present, 0


class _Replaced(str):
    """Text decoded with U+FFFD for bytes that are not UTF-8."""


def _utf8(data: Any) -> str | None:
    """A raw value (bytes, or msgspec.Raw) as text; None when empty."""
    if not len(data):
        return None
    try:
        return str(memoryview(data), "utf-8")
    except UnicodeDecodeError:
        return _Replaced(str(memoryview(data), "utf-8", "replace"))


def lookup(keys: np.ndarray, ref_keys: np.ndarray, ref_values: np.ndarray, missing: int = -1) -> np.ndarray:
    """For each key, the ref_value whose ref_key equals it (`missing` where none does)."""
    out = np.full(len(keys), missing, dtype=np.asarray(ref_values).dtype if len(ref_values) else np.int64)
    if not len(keys) or not len(ref_keys):
        return out
    order = np.argsort(ref_keys, kind="stable")
    sorted_keys = ref_keys[order]
    pos = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    hit = sorted_keys[pos] == keys
    out[hit] = np.asarray(ref_values)[order[pos[hit]]]
    return out


def json_values(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The JSON text of each value (number, boolean or string); nulls and non-finite floats stay null.

    A column with few distinct values comes back dictionary-encoded, which `json_objects` exploits.
    """
    array = _plain(array)
    if pa.types.is_null(array.type):
        return pa.nulls(len(array), pa.string())
    if pa.types.is_floating(array.type):
        array = pc.if_else(pc.is_finite(array), array, pa.scalar(None, array.type))
    text = pa.types.is_string(array.type) or pa.types.is_large_string(array.type)
    if text or pc.count_distinct(array).as_py() <= _few(len(array)):
        encoded = array.dictionary_encode()
        texts = [json.dumps(v, ensure_ascii=False) for v in encoded.dictionary.to_pylist()]
        return pa.DictionaryArray.from_arrays(encoded.indices, pa.array(texts, pa.string()))
    return pc.cast(array, pa.string())


def json_labels(codes: np.ndarray, values: list[Any]) -> pa.DictionaryArray:
    """JSON strings of `values[code]` per row (null where the code is -1): names looked up by id."""
    return dict_array(codes, [json.dumps(str(v), ensure_ascii=False) for v in values])


def json_objects(fields: dict[str, pa.Array], rows: int, members: pa.DictionaryArray | None = None) -> pa.Array:
    """One JSON object per row from columns of JSON text (see `json_values`); null fields are left out.

    `members` holds ready `"key":value,...` texts (no braces) written after the dictionary-encoded
    fields. Those are written once per distinct combination of their values (a kernel table has few
    launch configurations); the other fields are appended with Arrow's string kernels.
    """
    few = {k: v for k, v in fields.items() if pa.types.is_dictionary(v.type) and len(v.dictionary) <= _few(rows)}
    parts = [(json.dumps(k) + ":", v) for k, v in few.items()]
    if members is not None:
        parts.append(("", members))
    codes, heads = _combinations(parts, rows)
    many = [(k, _plain(v)) for k, v in fields.items() if k not in few]
    if not many:
        return dict_array(codes, [head + "}" for head in heads]).dictionary_decode()
    joined = [dict_array(codes, heads).dictionary_decode()]
    opened = np.array([len(head) > 1 for head in heads], dtype=bool)[codes]  # a member precedes: the next needs a comma
    for key, value in many:
        label = json.dumps(key) + ":"
        after = pc.binary_join_element_wise("," + label, value, "")
        joined.append(pc.if_else(pa.array(opened), after, pc.binary_join_element_wise(label, value, "")))
        opened |= value.is_valid().to_numpy(zero_copy_only=False)
    # Nulls join as "": joining with null_handling="skip" drops the rows whose members are all null (pyarrow 26).
    return pc.binary_join_element_wise(*joined, "}", "", null_handling="replace", null_replacement="")


def _combinations(parts: list[tuple[str, pa.DictionaryArray]], rows: int) -> tuple[np.ndarray, list[str]]:
    """(code per row, text per code): `{` and the `prefix + value` of each part that is neither null
    nor empty, comma-separated, written once per distinct combination of the parts' values."""
    codes = [v.indices.fill_null(-1).to_numpy().astype(np.int64) for _, v in parts]
    combination = np.zeros(rows, dtype=np.int32)
    for part_codes, (_, value) in zip(codes, parts, strict=True):
        combination, _ = factorize(combination.astype(np.int64) * (len(value.dictionary) + 1) + part_codes + 1)
    _, first = np.unique(combination, return_index=True)
    texts = [v.dictionary.to_pylist() for _, v in parts]
    heads = []
    for row in zip(*(c[first].tolist() for c in codes), strict=True) if parts else [()] * len(first):
        values = ((prefix, text[code]) for (prefix, _), text, code in zip(parts, texts, row, strict=True) if code >= 0)
        heads.append("{" + ",".join(prefix + value for prefix, value in values if value))
    return combination, heads


def _plain(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous array, dictionary columns decoded."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return array.dictionary_decode() if pa.types.is_dictionary(array.type) else array


def _few(rows: int) -> int:
    """Most distinct values for a column to be joined per combination rather than per row."""
    return max(256, rows // 16)
