"""Serve a long skill file in pages a client can take whole.

Use `page = text_page(text, offset)`: `page.text` is at most PAGE_CHARS characters starting at
`offset`, cut after a line break when there is one in the page; `page.next_offset` is where the
next page starts (None on the last page). `get_skill` and the skill:// resources use it, so no
single reply exceeds common clients' tool-output limits (about 25,000 tokens).

Known limitations: tokens are estimated as characters / 4 (English prose and Markdown); a
page of code or of non-Latin text can hold more tokens than that.
"""

from __future__ import annotations

from dataclasses import dataclass

CHARS_PER_TOKEN = 4  # the usual estimate for English text and Markdown
PAGE_TOKENS = 20_000  # one page: under common clients' 25k-token tool-output limit
PAGE_CHARS = PAGE_TOKENS * CHARS_PER_TOKEN


@dataclass(frozen=True)
class TextPage:
    text: str
    offset: int  # the first character of this page in the whole text
    next_offset: int | None  # where the next page starts; None on the last page
    total_chars: int


def text_page(text: str, offset: int = 0, limit: int = PAGE_CHARS) -> TextPage:
    """The page of `text` that starts at `offset`; ValueError when offset is past the end."""
    if offset < 0 or (offset > 0 and offset >= len(text)):
        raise ValueError(f"offset {offset} is outside the text (0 to {max(0, len(text) - 1)})")
    end = offset + limit
    if end >= len(text):
        return TextPage(text[offset:], offset, None, len(text))
    cut = text.rfind("\n", offset, end)
    if cut > offset:  # end the page after a whole line when the page holds a line break
        end = cut + 1
    return TextPage(text[offset:end], offset, end, len(text))


def continuation_note(name: str, path: str, page: TextPage) -> str:
    """The line that ends a page that is not the last: where the rest is and how to get it."""
    return (
        f"\n\n[Page ends at character {page.next_offset} of {page.total_chars}. Read on with "
        f'get_skill(name="{name}", path="{path}", offset={page.next_offset}).]\n'
    )
