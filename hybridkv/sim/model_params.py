"""Active parameter counts of the shipped layouts (the cost model's weight term).

Layouts describe caches, not weights, so the simulator keeps this table. An
entry is the number of parameters one token's forward pass multiplies by
(for mixture-of-experts models: the active ones), with its source. For the
Gemma 3 models it is the non-embedding parameters plus the (tied) output
projection, i.e. the text model's total; vision towers are left out.

A layout not in the table needs an explicit count (``--active-params``).
"""

from __future__ import annotations

ACTIVE_PARAMS: dict[str, float] = {
    # Gemma 3 technical report (arXiv 2503.19786), Table 1: embedding +
    # non-embedding parameters (the embedding doubles as the output projection).
    "gemma-3-27b": 1.416e9 + 25.600e9,
    "gemma-3-12b": 1.012e9 + 10.759e9,
    "gemma-3-4b": 0.675e9 + 3.209e9,
    "gemma-3-1b": 0.302e9 + 0.698e9,
    # Google, "Introducing Gemma 3 270M": 170M embedding + 100M transformer.
    "gemma-3-270m": 0.270e9,
    # AI21 Jamba model card / paper (arXiv 2403.19887): 12B active of 52B.
    "jamba-v0.1": 12e9,
    # Jamba-1.5 paper (arXiv 2408.12570): Mini has 12B active of 52B.
    "jamba-1.5-mini": 12e9,
    # Meta Llama 4 model card: 17B active (Scout 109B total, Maverick 400B).
    "llama-4-scout": 17e9,
    "llama-4-maverick": 17e9,
    # OpenAI gpt-oss model card (arXiv 2508.10925): 5.1B active of 117B,
    # 3.6B active of 21B.
    "gpt-oss-120b": 5.1e9,
    "gpt-oss-20b": 3.6e9,
    # Mistral 7B paper (arXiv 2310.06825) / Hugging Face: 7.24B parameters.
    "mistral-7b-v0.1": 7.24e9,
    # Ministral-8B-Instruct-2410 model card: 8.02B parameters.
    "ministral-8b": 8.02e9,
    # Cohere c4ai-command-r7b-12-2024 model card: 7 billion parameters.
    "command-r7b": 7e9,
    # IBM Bamba-9B model card: 9B parameters (as named).
    "bamba-9b": 9e9,
    # IBM Granite 4.0 announcement: H Tiny has 7B total, about 1B active.
    "granite-4.0-h-tiny": 1e9,
}


def active_params_for(layout_name: str, override: float | None = None) -> float:
    """``override`` when given, else the table's count for ``layout_name``.

    Raises ``ValueError`` naming ``--active-params`` for an unknown layout.
    """
    if override is not None:
        if not override > 0:
            raise ValueError(f"active_params must be > 0, got {override!r}")
        return float(override)
    count = ACTIVE_PARAMS.get(layout_name)
    if count is None:
        raise ValueError(
            f"no active parameter count for layout {layout_name!r}; pass --active-params "
            f"(e.g. 12e9); known: {', '.join(sorted(ACTIVE_PARAMS))}"
        )
    return count
