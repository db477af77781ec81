"""Plain-text rendering of search results for the terminal."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from medfaq.retriever.pipeline import SearchResponse

QUESTION_WIDTH = 70
QUERY_SHOWN = 200


def hits_table(response: SearchResponse, logged: bool = True) -> str:
    """A ranked table: rank, score, FAQ id, question (wrapped), source. An abstention says so first, and whether the
    question was `logged` for the experts' queue, then shows the hits as the closest FAQs, not as answers."""
    lines = [f"query: {textwrap.shorten(response.query, QUERY_SHOWN, placeholder=' ...')}"]
    if response.summary:
        lines.append(f"summary: {response.summary}")
    if not response.hits:
        lines.append("(no matching FAQ)")
        return "\n".join(lines)
    if response.abstained:
        lines.append("no FAQ matches well enough" + (": the question is logged for an expert" if logged else ""))
        lines.append("the closest FAQs, none of them an answer:")
    id_width = max(4, *(len(hit.id) for hit in response.hits))
    lines.append(f"{'rank':>4}  {'score':>8}  {'id':<{id_width}}  {'question':<{QUESTION_WIDTH}}  source")
    for hit in response.hits:
        wrapped = textwrap.wrap(hit.question, QUESTION_WIDTH) or [""]
        lines.append(
            f"{hit.rank:>4}  {hit.score:>8.4f}  {hit.id:<{id_width}}  {wrapped[0]:<{QUESTION_WIDTH}}  {hit.source}"
        )
        lines += [f"{'':>4}  {'':>8}  {'':<{id_width}}  {more}" for more in wrapped[1:]]
    return "\n".join(lines)
