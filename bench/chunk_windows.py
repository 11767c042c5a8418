"""Chunks against the local models' windows: how many would be truncated, before and after.

Usage: ``.venv/bin/python bench/chunk_windows.py [FILES…]`` (default ``docs/*.md``, the demo
corpus). Parses each Markdown file, chunks it as the compiler does (1,200 characters, 120
overlap), once bounded by 512 estimated tokens only (before) and once also by the model's own
window counted with its tokenizer (after, ``ingestion.compilation.generations.chunk_bounds``),
and counts per model the chunks over its window and the word pieces past it (never embedded).
"""

import glob
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "knowledgefs.settings")
import django  # noqa: E402

django.setup()
from ingestion import parsing  # noqa: E402
from ingestion.chunking import chunk_elements  # noqa: E402
from ingestion.tokens import approx_tokens, within_all  # noqa: E402
from knowledgefs.runtime import DEFAULT_MODEL_ID, MINILM_MODEL_ID, get_embedding_model  # noqa: E402

files = sys.argv[1:] or sorted(glob.glob(str(ROOT / "docs" / "*.md")))
elements = {f: parsing.parse(Path(f).read_bytes(), "text/markdown") for f in files}
for model_id in (MINILM_MODEL_ID, DEFAULT_MODEL_ID):
    model = get_embedding_model(model_id)
    window = model.max_input_tokens
    for label, bounds in (
        ("before (512 estimated)", [(approx_tokens, 512)]),
        ("after (and the window)", [(approx_tokens, 512), (model.count_tokens, window)]),
    ):
        count, budget = within_all(bounds)
        chunks = over = pieces = lost = 0
        for parsed in elements.values():
            for chunk in chunk_elements(
                parsed,
                target_chars=1200,
                overlap_chars=120,
                max_tokens=budget,
                overlap_tokens=51 * budget // 512,
                count_tokens=count,
            ):
                n = model.count_tokens(chunk.text)
                chunks, pieces = chunks + 1, pieces + n
                if n > window:
                    over, lost = over + 1, lost + n - window
        print(
            f"{model_id} {label}: {chunks} chunks, {over} over {window} word pieces, "
            f"{lost} of {pieces} word pieces never embedded ({lost / pieces:.1%})"
        )
