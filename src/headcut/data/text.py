"""Data as text: bytes decoded in the data's encoding (newlines made ``\\n``, a byte that is not text refused
with its offset), a ``.txt`` file read lazily line by line (:class:`TextFile`), and a long text cut into pieces
of at most :data:`PIECE_CHARS` characters for the tokenizer (:func:`pieces_of`)."""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator

from ..errors import HeadcutError
from .streams import DataSource, opened, read_chunk

#: characters per tokenizer call when a text is cut into causal-LM blocks (a fast tokenizer needs about a
#: hundred bytes per character while it works)
PIECE_CHARS = 1 << 15


def is_utf8(encoding: str) -> bool:
    return codecs.lookup(encoding).name == "utf-8"


def guess_encoding(sample: bytes) -> str:
    """A likely encoding of bytes that are not UTF-8 (cheap: byte-order marks and byte ranges only)."""
    if sample.startswith((b"\xff\xfe", b"\xfe\xff")) or sample[1:200:2].count(0) > 40:
        return "utf-16"
    high = {b for b in sample if 0x80 <= b <= 0x9F}
    if high and not high & {0x81, 0x8D, 0x8F, 0x90, 0x9D}:  # bytes cp1252 maps (curly quotes, dashes, euro)
        return "cp1252"
    return "latin-1"


def not_text_error(source: DataSource, encoding: str, exc: UnicodeDecodeError, offset: int) -> HeadcutError:
    """The error for bytes that are not ``encoding`` text (``offset``: of the first bad byte in the file)."""
    byte = exc.object[exc.start] if exc.start < len(exc.object) else None
    sample = exc.object[:4096] if exc.start < 4096 else exc.object[exc.start - 2048 : exc.start + 2048]
    where = f"byte 0x{byte:02x} at offset {offset}" if byte is not None else f"offset {offset}"
    if is_utf8(encoding):
        return HeadcutError(
            f"cannot read {source.shown}: it is not UTF-8 text ({where}); pass --encoding "
            f"{guess_encoding(sample)} (or the file's encoding)"
        )
    return HeadcutError(
        f"cannot read {source.shown}: it is not {encoding} text ({where}); pass the file's encoding with --encoding"
    )


def nul_error(source: DataSource, encoding: str) -> HeadcutError:
    if is_utf8(encoding):
        return HeadcutError(
            f"cannot read {source.shown}: it holds NUL characters, so it is not UTF-8 text; if it is "
            "UTF-16 text, pass --encoding utf-16"
        )
    return HeadcutError(f"cannot read {source.shown}: it holds NUL characters, so it is not {encoding} text")


def decoded(source: DataSource, encoding: str) -> Iterator[str]:
    """The text of ``source`` in chunks (``CHUNK`` bytes each), newlines made ``\\n``: a byte that is not
    ``encoding`` text, or a NUL character, is a one-line error naming its offset and a likely encoding."""
    with opened(source) as data:
        decoder = codecs.getincrementaldecoder(encoding)("strict")
        offset, carry_cr, first = 0, "", True
        while True:
            chunk = read_chunk(data, source)
            if first and not chunk:
                raise HeadcutError(f"{source.shown} is empty")
            pending = len(decoder.getstate()[0])
            try:
                text = decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as exc:
                raise not_text_error(source, encoding, exc, offset - pending + exc.start) from None
            offset += len(chunk)
            if first:
                text, first = text.removeprefix("\ufeff"), False
            if "\x00" in text:
                raise nul_error(source, encoding)
            text = carry_cr + text
            carry_cr = ""
            if chunk and text.endswith("\r"):
                text, carry_cr = text[:-1], "\r"
            if "\r" in text:
                text = text.replace("\r\n", "\n").replace("\r", "\n")
            if text:
                yield text
            if not chunk:
                return


class TextFile:
    """A ``.txt`` data file (or pipe) read lazily: never whole, one chunk of :data:`CHUNK` bytes at a time
    (a pipe can be read once). ``column_names``: the one column, ``text``, as for a table."""

    column_names = ("text",)

    def __init__(self, source: DataSource, encoding: str = "utf-8") -> None:
        self.source, self.encoding = source, encoding

    def lines(self, max_chars: int, limit: int | None = None) -> tuple[list[str], bool]:
        """``(lines, stopped)``: the non-blank lines, each cut to ``max_chars`` characters; at most
        ``limit`` of them (``stopped``: the file was not read to its end)."""
        out: list[str] = []
        current: list[str] = []
        room = max_chars

        def finish() -> None:
            nonlocal current, room
            line = "".join(current)
            if line.strip():
                out.append(line)
            current, room = [], max_chars

        for text in decoded(self.source, self.encoding):
            parts = text.split("\n")
            for i, part in enumerate(parts):
                if i:
                    finish()
                    if limit is not None and len(out) >= limit:
                        return out, True
                if room > 0 and part:
                    current.append(part[:room])
                    room -= min(room, len(part))
        finish()
        if limit is not None and len(out) > limit:
            return out[:limit], True
        return out, False

    def pieces(self) -> Iterator[str]:
        """The whole text (its lines joined by ``\\n``) in pieces (see :func:`pieces_of`)."""
        return pieces_of(decoded(self.source, self.encoding), strip_final_newline=True)


def pieces_of(chunks: Iterable[str], strip_final_newline: bool = False) -> Iterator[str]:
    """The text of ``chunks`` (consecutive parts of one text) in pieces of at most :data:`PIECE_CHARS`
    characters, cut before a line break or space where there is one, so that tokenizing the pieces one by one
    gives the tokens of the whole text (up to a start-of-text marker some tokenizers add to each piece: one
    token in thousands at most) at a small, bounded cost each. ``strip_final_newline``: drop the line break
    that ends the last line of a file."""
    carry = ""
    for text in chunks:
        buffer, start = carry + text, 0
        while len(buffer) - start > PIECE_CHARS:
            end = start + PIECE_CHARS
            cut = buffer.rfind("\n", start + 1, end)
            if cut < 0:
                cut = max(buffer.rfind(" ", start + 1, end), buffer.rfind("\t", start + 1, end))
            if cut < 0:  # no space in a long run: cut anywhere
                cut = end
            yield buffer[start:cut]
            start = cut
        carry = buffer[start:]
    if strip_final_newline:
        carry = carry.removesuffix("\n")
    if carry:
        yield carry
