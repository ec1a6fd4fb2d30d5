"""Model folders behind URLs and on the Hub: config.json with single or sharded weights, read in few rounds.

A folder is named by a Hub repository (its listing gives every file and size), by
the URL of its index, by the URL of its config.json, or by its own URL ending in
`/`. Weights are looked for as `from_pretrained` looks: the safetensors index,
`model.safetensors`, the `.bin` index, `pytorch_model.bin`. Each request is sent
as soon as what it depends on is known:
1. config.json with the index, or with the single file's first bytes (and a
   `.bin` file's end), all at once; without a listing, the files that are not
   there answer 404, and the `.bin` names are tried only when no safetensors is;
2. every shard's header at once, each asked for the length its tensor names in
   the index make (`header_guess`), so that nearly every shard costs one range
   and none waits for another's; a longer header costs one more range;
3. a `.bin` model's shards take `remote_zip`'s rounds together.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any

import orjson

from memlayout.errors import CorruptCheckpointError, RemoteReadError, UnrecognizedFormatError
from memlayout.load import detect
from memlayout.load.hf_ties import declared_ties
from memlayout.load.remote_file import header_length, load_file
from memlayout.load.remote_zip import (
    CONTENTS_SKIPPED,
    HEAD_BYTES,
    attach_reader,
    first_reads,
    torch_zip_sources,
)

if TYPE_CHECKING:
    from memlayout.io.remote import RemoteFiles
    from memlayout.load.records import LoadedSource
    from memlayout.load.remote_location import RemoteOptions

CONFIG = "config.json"
HEADER_ENTRY_BYTES = 50
"""A safetensors header entry beyond its name and numbers:
`"NAME":{"dtype":"BF16","shape":[..],"data_offsets":[..,..]},`."""
HEADER_SPARE_BYTES = 48
"""`__metadata__` ({"format":"pt"}), the braces and the padding to 8 bytes."""


def folder_of(url: str) -> str | None:
    """The model folder a URL names (ending in /): itself when it ends in /, the folder of its index or config.json."""
    if url.endswith("/"):
        return url
    name = posixpath.basename(url.split("?", 1)[0])
    if name == CONFIG or name.endswith(".index.json"):
        return url[: len(url) - len(name)]
    return None


def load_folder(
    given: str, base: str, listing: dict[str, int] | None, files: RemoteFiles, options: RemoteOptions,
    index: str | None = None,
) -> LoadedSource:
    """A model folder at `base` (a URL ending in /).

    Args:
        given: The path as the user wrote it, for the report.
        base: The folder's URL, ending in /.
        listing: Its files and their sizes (the Hub's listing), or None to find them by trying.
        files: The source's reads.
        options: The run's remote options.
        index: The index file the user named, when a URL named one.
    """
    from memlayout.load.hf_dir import BIN_INDEX, BIN_SINGLE, SAFETENSORS_INDEX, SAFETENSORS_SINGLE

    if listing is not None:
        files.tally.sizes.update({base + name: size for name, size in listing.items()})
        present = set(listing)
        index = index or next((n for n in (SAFETENSORS_INDEX, BIN_INDEX) if n in present), None)
        if index is None and SAFETENSORS_INDEX not in present:
            index = next((n for n in sorted(present) if n.endswith(".index.json") and "/" not in n), None)
        single = next((n for n in (SAFETENSORS_SINGLE, BIN_SINGLE) if n in present), None)
        config, index_json, single = _first_round(base, files, CONFIG in present, index, None if index else single)
    elif index is not None:
        config, index_json, single = _first_round(base, files, True, index, None)
    else:
        config, index_json, single = _first_round(base, files, True, SAFETENSORS_INDEX, SAFETENSORS_SINGLE)
        index = SAFETENSORS_INDEX if index_json is not None else None
        if index is None and single is None:
            _, index_json, single = _first_round(base, files, False, BIN_INDEX, BIN_SINGLE)
            index = BIN_INDEX if index_json is not None else None
    if index is not None and index_json is not None:
        source = _sharded(given, base, index, index_json, files, options)
    elif single is not None and single.endswith(".safetensors"):
        source = _safetensors_shards(given, {single: []}, [base + single], files, options)
    elif single is not None:
        source = _pickled_shards(given, [single], [base + single], files, options)
    else:
        raise UnrecognizedFormatError(
            f"{given} has none of {SAFETENSORS_INDEX}, {SAFETENSORS_SINGLE}, {BIN_INDEX}, {BIN_SINGLE}",
            "name a model folder (config.json with its weights), or the URL of one checkpoint file",
        )
    if isinstance(config, dict):
        source.declared_ties += declared_ties(config, [t.name for t in source.tensors])
        source.model_config = config
    elif config is None:
        source.notes.append(f"{given} has no {CONFIG}: no tie intent is known")
    return source


def _first_round(
    base: str, files: RemoteFiles, want_config: bool, index: str | None, single: str | None,
) -> tuple[Any, Any, str | None]:
    """(config or None, the index or None, the single file's name or None), fetched together; a 404 is absence."""
    wholes = [base + name for name in ((CONFIG,) if want_config else ()) + ((index,) if index else ())]
    ranges = first_reads(base + single, files) if single else []
    wants: list[tuple[str, int, int | None]] = [(url, 0, None) for url in wholes] + list(ranges)
    got = files.attempt(wants)
    for out in got:
        if isinstance(out, RemoteReadError) and "(HTTP 404)" not in out.message:
            raise out
    found = dict(zip(wholes, got, strict=False))
    config = _json(base + CONFIG, found.get(base + CONFIG), "model config") if want_config else None
    index_json = _json(base + index, found.get(base + index), "index") if index else None
    if single is not None and isinstance(got[len(wholes)], RemoteReadError):
        single = None
    return config, index_json, single


def _json(url: str, raw: Any, what: str) -> Any:
    if not isinstance(raw, bytes):
        return None
    try:
        return orjson.loads(raw)
    except ValueError as exc:
        raise CorruptCheckpointError(f"{url}: the {what} is not readable JSON ({exc})") from exc


def _sharded(
    given: str, base: str, index_name: str, index: Any, files: RemoteFiles, options: RemoteOptions,
) -> LoadedSource:
    from memlayout.load.hf_dir import index_shards

    index_url = base + index_name
    shards = index_shards(index, index_url)
    urls = [base + shard for shard in shards]
    if all(shard.endswith(".safetensors") for shard in shards):
        # Without a listing a shard's size is unknown; the index's total over its shards stands for it.
        metadata = index.get("metadata")
        total = metadata.get("total_size") if isinstance(metadata, dict) else None
        share = total // len(urls) if isinstance(total, int) and total > 0 else None
        typical = {url: files.tally.sizes.get(url, share) for url in urls}
        return _safetensors_shards(given, shards, urls, files, options, typical)
    return _pickled_shards(given, list(shards), urls, files, options)


def header_guess(names: list[str], file_size: int | None) -> int:
    """How many first bytes of a safetensors shard hold its header, from its tensor names in the index.

    Each entry is its name and about `HEADER_ENTRY_BYTES` of JSON, plus its two
    data offsets, whose digits are the file size's at most, and its shape, whose
    dimensions grow with the file too (`32,96` in a 20 KB shard, `4096,11008` in a
    GB one). Measured on transformers' shards from 20 KB to 5 GB, the guess is 4-15%
    over the real length (tests/remote/test_many_paths.py), so a shard costs one
    range; a longer header costs a second one for its rest.
    """
    if not names:  # a single file: its first bytes say the length
        return HEAD_BYTES
    digits = len(str(file_size)) if file_size is not None else 10
    per_entry = HEADER_ENTRY_BYTES + max(5, 2 * digits - 8) + 2 * digits
    return 8 + HEADER_SPARE_BYTES + sum(len(name.encode()) + per_entry for name in names)


def _safetensors_shards(
    given: str, shards: dict[str, list[str]], urls: list[str], files: RemoteFiles, options: RemoteOptions,
    typical: dict[str, int | None] | None = None,
) -> LoadedSource:
    from memlayout.load.hf_dir import safetensors_shards_source
    from memlayout.load.safetensors_file import parse_header

    asked = [
        (url, 0, max(HEAD_BYTES, header_guess(names, (typical or {}).get(url, files.tally.sizes.get(url)))))
        for url, names in zip(urls, shards.values(), strict=True)
    ]
    raws = files.read_ranges(asked)
    ends = []
    for url, raw in zip(urls, raws, strict=True):
        if not detect.looks_like_safetensors(raw[:HEAD_BYTES]):
            raise CorruptCheckpointError(f"{url} is no safetensors file, though the index names it as a shard")
        ends.append(min(detect.SAFETENSORS_HEADER_LENGTH_BYTES + header_length(url, raw), files.size(url)))
    files.read_ranges([(url, len(raw), end) for url, end, raw in zip(urls, ends, raws, strict=True) if end > len(raw)])
    headers = [
        parse_header(url, files.read(url, 0, end), files.size(url)) for url, end in zip(urls, ends, strict=True)
    ]
    source, spans = safetensors_shards_source(given, list(shards), headers, urls, read_in_place=False)
    attach_reader(source, files, urls, spans.starts, spans.sizes, spans.file_of, options)
    return source


def _pickled_shards(
    given: str, shards: list[str], urls: list[str], files: RemoteFiles, options: RemoteOptions
) -> LoadedSource:
    from memlayout.load.hf_dir import pickled_shards_source
    files.read_ranges([read for url in urls for read in first_reads(url, files)])
    zips = [url for url in urls if detect.is_zip(url, files.read(url, 0, HEAD_BYTES))]
    loaded = dict(zip(zips, torch_zip_sources(zips, files, options), strict=True))
    for url in urls:
        if url not in loaded:  # a shard of another format, read as one file (or refused in its one line)
            loaded[url] = load_file(url, files, options)
    by_shard = {shard: loaded[url] for shard, url in zip(shards, urls, strict=True)}
    source = pickled_shards_source(given, shards, by_shard.__getitem__)
    if not options.fetch_contents:
        source.reader = None
        source.content_unreadable = CONTENTS_SKIPPED
    return source
