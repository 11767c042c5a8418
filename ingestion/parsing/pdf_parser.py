"""PDF parser: text layer per page via pypdf (no OCR)."""

from __future__ import annotations

import io
from dataclasses import dataclass

from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError, FileNotDecryptedError

from .base import CorruptDocument, Element, EncryptedDocument, clean_text
from .text_parser import split_paragraphs

_CORRUPT = "corrupt or unreadable PDF"


@dataclass(frozen=True)
class PdfResult:
    """Elements of a PDF plus its page accounting."""

    elements: list[Element]
    page_count: int
    pages_without_text: list[int]


def _open(data: bytes) -> PdfReader:
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
    except FileNotDecryptedError as exc:
        raise EncryptedDocument() from exc
    except Exception as exc:
        raise CorruptDocument(_CORRUPT) from exc
    if reader.is_encrypted:
        try:
            result = reader.decrypt("")
        except DependencyError as exc:
            raise EncryptedDocument("encrypted PDF uses an unsupported cipher") from exc
        except Exception as exc:
            raise CorruptDocument(_CORRUPT) from exc
        if result == PasswordType.NOT_DECRYPTED:
            raise EncryptedDocument()
    return reader


def parse_pdf(data: bytes) -> PdfResult:
    """Extract the text layer of every page, split into paragraphs on blank lines.

    Each element carries its 1-based ``page_number``. A PDF protected by an owner password
    only is opened with the empty user password. Pages with no extractable text (scans)
    yield no elements and are listed in ``pages_without_text``; a page whose extraction
    fails is treated the same way.

    Raises:
        EncryptedDocument: the PDF needs a user password.
        CorruptDocument: "corrupt or unreadable PDF" (damaged, truncated beyond repair,
            no pages, or no page could be read).
    """
    reader = _open(data)
    try:
        pages = list(reader.pages)
    except FileNotDecryptedError as exc:
        raise EncryptedDocument() from exc
    except Exception as exc:
        raise CorruptDocument(_CORRUPT) from exc
    if not pages:
        raise CorruptDocument(_CORRUPT)
    elements: list[Element] = []
    without_text: list[int] = []
    failures = 0
    for number, page in enumerate(pages, start=1):
        try:
            text = page.extract_text() or ""
        except FileNotDecryptedError as exc:
            raise EncryptedDocument() from exc
        except Exception:
            failures += 1
            text = ""
        paragraphs = split_paragraphs(clean_text(text))
        if not paragraphs:
            without_text.append(number)
        elements.extend(Element(type="paragraph", text=p, page_number=number) for p in paragraphs)
    if failures == len(pages):
        raise CorruptDocument(_CORRUPT)
    return PdfResult(elements=elements, page_count=len(pages), pages_without_text=without_text)
